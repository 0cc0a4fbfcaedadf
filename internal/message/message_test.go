package message

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTruncate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		s    string
		n    int
		want string
	}{
		{"", 10, ""},
		{"short", 5, "short"},
		{"short", 10, "short"},
		{"exactly ten", 11, "exactly ten"},
		{"a longer message", 10, "a longe..."},
		// Never a partial rune: "ü" is two bytes, "€" three, "😀" four.
		{"aaaaaüxxxx", 10, "aaaaaü..."},
		{"aaaaaaüxxx", 10, "aaaaaa..."},
		{"aaaaa€bcd", 10, "aaaaa..."},
		{"aaaa😀bcd", 10, "aaaa..."},
		{"😀😀😀😀", 10, "😀..."},
		{"😀😀😀😀", 6, "..."},
		// An n that leaves no room for the ellipsis.
		{"abcdef", 2, "..."},
		{"abcdef", 0, "..."},
	} {
		got := Truncate(tc.s, tc.n)
		if got != tc.want {
			t.Errorf("Truncate(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
		if tc.n >= len(Ellipsis) && len(got) > tc.n {
			t.Errorf("Truncate(%q, %d) = %q: %d bytes", tc.s, tc.n, got, len(got))
		}
		if !utf8.ValidString(got) {
			t.Errorf("Truncate(%q, %d) = %q: not valid UTF-8", tc.s, tc.n, got)
		}
	}
	// A long message of multi-byte runes, at every length.
	s := strings.Repeat("aé€😀", 50)
	for n := len(Ellipsis); n < len(s); n++ {
		got := Truncate(s, n)
		if len(got) > n || !utf8.ValidString(got) || !strings.HasPrefix(s, strings.TrimSuffix(got, Ellipsis)) {
			t.Fatalf("Truncate(s, %d) = %q", n, got)
		}
		if len(got) < n-utf8.UTFMax {
			t.Fatalf("Truncate(s, %d) = %q: %d bytes, more cut than a rune", n, got, len(got))
		}
	}
}

func TestUnjoin(t *testing.T) {
	t.Parallel()
	a, b := errors.New("a"), errors.New("b")
	if got := Unjoin(errors.Join(a, b)); len(got) != 2 || !errors.Is(got[0], a) || !errors.Is(got[1], b) || errors.Is(got[0], b) {
		t.Errorf("Unjoin(Join(a, b)) = %v", got)
	}
	if got := Unjoin(a); len(got) != 1 || !errors.Is(got[0], a) {
		t.Errorf("Unjoin(a) = %v", got)
	}
	// A wrapped join is one error: its context belongs to all of it.
	w := fmt.Errorf("ctx: %w", errors.Join(a, b))
	if got := Unjoin(w); len(got) != 1 || got[0].Error() != "ctx: a\nb" {
		t.Errorf("Unjoin(wrapped join) = %v", got)
	}
	if got := Unjoin(fmt.Errorf("%w and %w", a, b)); len(got) != 2 {
		t.Errorf("Unjoin(Errorf with two %%w) = %v, want both", got)
	}
}
