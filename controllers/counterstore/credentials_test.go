package counterstore

import (
	"fmt"
	"testing"
	"time"
)

func TestNextUserCredentials(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	const overlap = 10 * time.Minute
	n := 0
	gen := func() (string, error) { n++; return fmt.Sprintf("generated-password-%02d", n), nil }
	steps := []struct {
		what    string
		at      time.Time
		rotate  string
		want    UserCredentials
		changed bool
	}{
		{"a new namespace user gets a password", t0, "", UserCredentials{Password: "generated-password-01"}, true},
		{"nothing to do", t0.Add(time.Hour), "", UserCredentials{Password: "generated-password-01"}, false},
		{"a rotation keeps the old password for the overlap", t0.Add(time.Hour), "r1",
			UserCredentials{Password: "generated-password-02", Previous: "generated-password-01", PreviousExpires: t0.Add(time.Hour + overlap), Rotated: "r1"}, true},
		{"the same request again does nothing", t0.Add(time.Hour + time.Minute), "r1",
			UserCredentials{Password: "generated-password-02", Previous: "generated-password-01", PreviousExpires: t0.Add(time.Hour + overlap), Rotated: "r1"}, false},
		{"the old password goes when the overlap ends", t0.Add(time.Hour + overlap), "r1",
			UserCredentials{Password: "generated-password-02", Rotated: "r1"}, true},
		{"a second rotation", t0.Add(2 * time.Hour), "r2",
			UserCredentials{Password: "generated-password-03", Previous: "generated-password-02", PreviousExpires: t0.Add(2*time.Hour + overlap), Rotated: "r2"}, true},
		{"a third before the second's overlap ends replaces the previous password", t0.Add(2*time.Hour + time.Minute), "r3",
			UserCredentials{Password: "generated-password-04", Previous: "generated-password-03", PreviousExpires: t0.Add(2*time.Hour + time.Minute + overlap), Rotated: "r3"}, true},
	}
	var cur UserCredentials
	for i, s := range steps {
		got, changed, err := NextUserCredentials(cur, s.rotate, s.at, overlap, gen)
		if err != nil {
			t.Fatalf("step %d (%s): %v", i, s.what, err)
		}
		if got != s.want || changed != s.changed {
			t.Fatalf("step %d (%s): NextUserCredentials = %+v, %v; want %+v, %v", i, s.what, got, changed, s.want, s.changed)
		}
		cur = got
	}
	if got, want := cur.Passwords(), []string{"generated-password-04", "generated-password-03"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Passwords() = %v, want %v", got, want)
	}
}
