package idempotency

import (
	"errors"
	"fmt"
	"strings"
)

// MaxKeyLength is the longest key accepted, in bytes after parsing (idempotency.max_key_length).
const MaxKeyLength = 255

// KeyError says why an Idempotency-Key header value was refused (the middleware answers 400).
type KeyError struct{ Reason string }

func (e *KeyError) Error() string { return "Idempotency-Key: " + e.Reason }

// ErrNoKey: the request has no Idempotency-Key header.
var ErrNoKey = errors.New("Idempotency-Key: missing")

// ParseKey parses one Idempotency-Key header value: a Structured Field string ("abc", with
// \" and \\ escapes, printable ASCII only) or, for clients that send it bare, a token of
// RFC 9110 tchars plus ':' and '/' (a bare UUID is a token). Leading and trailing spaces are
// ignored. The key is 1 to MaxKeyLength bytes after parsing.
func ParseKey(value string) (string, error) {
	v := strings.Trim(value, " \t")
	if v == "" {
		return "", &KeyError{"empty"}
	}
	var key string
	if v[0] == '"' {
		var b strings.Builder
		i := 1
		closed := false
		for ; i < len(v); i++ {
			c := v[i]
			switch {
			case c == '\\':
				if i+1 >= len(v) || (v[i+1] != '"' && v[i+1] != '\\') {
					return "", &KeyError{"a string may escape only \" and \\"}
				}
				i++
				b.WriteByte(v[i])
			case c == '"':
				closed = true
			case c < 0x20 || c > 0x7e:
				return "", &KeyError{fmt.Sprintf("byte 0x%02x is not printable ASCII", c)}
			default:
				b.WriteByte(c)
			}
			if closed {
				break
			}
		}
		if !closed {
			return "", &KeyError{"unterminated string"}
		}
		if i+1 != len(v) {
			return "", &KeyError{"characters after the closing quote"}
		}
		key = b.String()
	} else {
		for i := 0; i < len(v); i++ {
			if !isKeyTokenChar(v[i]) {
				return "", &KeyError{fmt.Sprintf("byte 0x%02x is not allowed in a bare key (quote it as a string)", v[i])}
			}
		}
		key = v
	}
	if key == "" {
		return "", &KeyError{"empty"}
	}
	if len(key) > MaxKeyLength {
		return "", &KeyError{fmt.Sprintf("%d bytes, more than %d", len(key), MaxKeyLength)}
	}
	return key, nil
}

// isKeyTokenChar: an RFC 9110 tchar, or ':' or '/'.
func isKeyTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0
}

// keyFromHeader: the request's key from its header lines; several lines are refused (one
// request, one key).
func keyFromHeader(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", ErrNoKey
	case 1:
		return ParseKey(values[0])
	}
	return "", &KeyError{"more than one header line"}
}
