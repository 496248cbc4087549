package views

import (
	"encoding/json"
	"net/http"

	"github.com/caddyserver/caddy/v2"
)

// Handler is a module's admin endpoint: build's view as JSON on GET, 405
// for any other method. Every module serves its view through it, so the
// admin routes answer alike.
func Handler[V any](build func() V) caddy.AdminHandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if r.Method != http.MethodGet {
			return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed}
		}
		w.Header().Set("Content-Type", "application/json")
		return json.NewEncoder(w).Encode(build())
	}
}
