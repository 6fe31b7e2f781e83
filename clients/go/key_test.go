package idempotency

import (
	"errors"
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	long := strings.Repeat("k", MaxKeyLength)
	cases := []struct {
		in, key string // key "" with ok false: refused
		ok      bool
	}{
		{`"abc"`, "abc", true},
		{`"a b,c;d=e"`, "a b,c;d=e", true},
		{`"say \"hi\" \\ bye"`, `say "hi" \ bye`, true},
		{` "padded" `, "padded", true},
		{`abc`, "abc", true},
		{`01890a5d-ac96-774b-bcce-b302099a8057`, "01890a5d-ac96-774b-bcce-b302099a8057", true},
		{`urn:uuid:1/2!#$%&'*+-.^_` + "`|~", `urn:uuid:1/2!#$%&'*+-.^_` + "`|~", true},
		{`"` + long + `"`, long, true},
		{long, long, true},
		{`"` + long + `k"`, "", false}, // 256 bytes
		{long + "k", "", false},
		{``, "", false},
		{`""`, "", false},
		{`   `, "", false},
		{`"abc`, "", false},            // unterminated
		{`"abc"x`, "", false},          // after the closing quote
		{`"abc";p=1`, "", false},       // parameters: not a bare string
		{`"a\nb"`, "", false},          // only \" and \\ escape
		{"\"a\x01b\"", "", false},      // control character
		{"\"caf\xc3\xa9\"", "", false}, // not ASCII
		{`a b`, "", false},             // space in a token
		{`a"b`, "", false},             // quote in a token
		{`a,b`, "", false},             // a list
		{"caf\xc3\xa9", "", false},     // not ASCII
		{`a;b`, "", false},             // parameters
		{`"\"`, "", false},             // the escape eats the closing quote
		{`"\\"`, `\`, true},            // an escaped backslash, then the quote
		{`"` + strings.Repeat(`\\`, 128) + `"`, strings.Repeat(`\`, 128), true},
	}
	for _, c := range cases {
		key, err := ParseKey(c.in)
		if c.ok && (err != nil || key != c.key) {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", c.in, key, err, c.key)
		}
		if !c.ok {
			var ke *KeyError
			if err == nil || !errors.As(err, &ke) {
				t.Errorf("ParseKey(%q) = %q, %v; want a *KeyError", c.in, key, err)
			}
		}
	}
}

func TestKeyFromHeader(t *testing.T) {
	if _, err := keyFromHeader(nil); err != ErrNoKey {
		t.Errorf("no header: %v, want ErrNoKey", err)
	}
	if _, err := keyFromHeader([]string{"a", "b"}); err == nil {
		t.Errorf("two header lines accepted")
	}
	if k, err := keyFromHeader([]string{`"a"`}); err != nil || k != "a" {
		t.Errorf("one header line: %q, %v", k, err)
	}
}
