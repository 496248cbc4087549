package ldapmatch_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/edgesteer/edgesteer/caddymodules/ldapmatch"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	yes, no := true, false
	tests := []struct {
		input       string
		expected    ldapmatch.MatchLDAP
		expectedErr string // with the file and line; empty: must parse
	}{
		{input: "ldap", expected: ldapmatch.MatchLDAP{}},
		{input: `ldap {
			operation bind search
			bind_dn *,o=acme,* *,o=globex,*
			bind_dn_regexp ^uid=
			anonymous false
			starttls true
		}`, expected: ldapmatch.MatchLDAP{Operations: []string{"bind", "search"}, BindDNs: []string{"*,o=acme,*", "*,o=globex,*"},
			BindDNRegexp: "^uid=", Anonymous: &no, StartTLS: &yes}},
		// Lists add up when repeated.
		{input: "ldap {\noperation bind\noperation extended\nbind_dn a\nbind_dn b c\n}",
			expected: ldapmatch.MatchLDAP{Operations: []string{"bind", "extended"}, BindDNs: []string{"a", "b", "c"}}},

		{input: "ldap bind", expectedErr: "ldap matcher: want no arguments, got 1: bind, at Testfile:1"},
		{input: "ldap {\ncolour blue\n}", expectedErr: `ldap matcher: unknown option "colour", at Testfile:2`},
		{input: "ldap {\noperation\n}", expectedErr: "ldap matcher: operation: want at least 1 argument, got none, at Testfile:2"},
		{input: "ldap {\nbind_dn_regexp ^a ^b\n}", expectedErr: "ldap matcher: bind_dn_regexp: want 1 argument, got 2: ^a ^b, at Testfile:2"},
		{input: "ldap {\nbind_dn_regexp ^a\nbind_dn_regexp ^b\n}", expectedErr: "ldap matcher: bind_dn_regexp given twice (first at Testfile:2), at Testfile:3"},
		{input: "ldap {\nanonymous true\nanonymous false\n}", expectedErr: "ldap matcher: anonymous given twice (first at Testfile:2), at Testfile:3"},
		{input: "ldap {\nanonymous false true\n}", expectedErr: "ldap matcher: anonymous: want 1 argument, got 2: false true, at Testfile:2"},
		{input: "ldap {\nanonymous no\n}", expectedErr: `ldap matcher: anonymous "no": want true or false, at Testfile:2`},
		{input: "ldap {\nstarttls 1\n}", expectedErr: `ldap matcher: starttls "1": want true or false, at Testfile:2`},
		{input: "ldap {\nstarttls\n}", expectedErr: "ldap matcher: starttls: want 1 argument, got none, at Testfile:2"},
		{input: "ldap {\nstarttls true {\nx\n}\n}", expectedErr: "ldap matcher: starttls takes no block, at Testfile:2"},
	}
	for i, test := range tests {
		var m ldapmatch.MatchLDAP
		err := m.UnmarshalCaddyfile(caddyfile.NewTestDispenser(test.input))
		if test.expectedErr != "" {
			if err == nil || !strings.Contains(err.Error(), test.expectedErr) {
				t.Errorf("test %d: want an error containing %q, got %v", i, test.expectedErr, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("test %d: %v", i, err)
		} else if !reflect.DeepEqual(m, test.expected) {
			t.Errorf("test %d: got %+v, want %+v", i, m, test.expected)
		}
	}
}
