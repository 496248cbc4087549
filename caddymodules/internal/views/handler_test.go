package views

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

func TestHandlerAnswersGETWithTheViewAsJSON(t *testing.T) {
	type view struct {
		Name string `json:"name"`
	}
	h := Handler(func() []view { return []view{{Name: "a"}} })
	w := httptest.NewRecorder()
	if err := h(w, httptest.NewRequest(http.MethodGet, "/x/", nil)); err != nil {
		t.Fatal(err)
	}
	if got := w.Header().Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type %q, want application/json", got)
	}
	if got, want := w.Body.String(), `[{"name":"a"}]`+"\n"; got != want {
		t.Errorf("body %q, want %q", got, want)
	}
}

func TestHandlerRefusesOtherMethods(t *testing.T) {
	built := false
	h := Handler(func() any { built = true; return nil })
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodHead} {
		w := httptest.NewRecorder()
		err := h(w, httptest.NewRequest(m, "/x/", nil))
		var apiErr caddy.APIError
		if !errors.As(err, &apiErr) || apiErr.HTTPStatus != http.StatusMethodNotAllowed {
			t.Errorf("%s: error %v, want a 405 APIError", m, err)
		}
		if w.Body.Len() != 0 {
			t.Errorf("%s: wrote %q", m, w.Body.String())
		}
	}
	if built {
		t.Error("the view was built for a refused method")
	}
}
