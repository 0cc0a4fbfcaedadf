package helmchart

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/floodgate-dev/floodgate/test/helmchart/helmtest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden from the current chart")

// TestGolden renders the chart with the default values and with each values
// set, and compares the whole manifest (without CRDs, which TestChartCRDs
// checks) against testdata/golden/<name>.yaml. Review a golden diff like a
// code diff; rewrite them with -update.
func TestGolden(t *testing.T) {
	t.Parallel()
	cases := map[string][]string{"default": nil}
	for name, file := range valueSets(t) {
		cases[name] = []string{"-f", file}
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got := helmtest.Template(t, args...)
			path := filepath.Join("testdata", "golden", name+".yaml")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (create it with `go test ./test/helmchart -run TestGolden -update`)", err)
			}
			if diff := firstDiff(string(want), got); diff != "" {
				t.Errorf("helm template with %s differs from %s (rewrite with -update if intended):\n%s", describe(args), path, diff)
			}
		})
	}
}

func describe(args []string) string {
	if len(args) == 0 {
		return "the default values"
	}
	return strings.Join(args, " ")
}

// firstDiff describes the first differing line of want and got, with a
// little context, or returns "" when they are equal.
func firstDiff(want, got string) string {
	if want == got {
		return ""
	}
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	i := 0
	for i < len(w) && i < len(g) && w[i] == g[i] {
		i++
	}
	var b strings.Builder
	for j := max(0, i-3); j < i; j++ {
		fmt.Fprintf(&b, "  %4d   %s\n", j+1, w[j])
	}
	if i < len(w) {
		fmt.Fprintf(&b, "- %4d   %s\n", i+1, w[i])
	} else {
		b.WriteString("-        (end of golden file)\n")
	}
	if i < len(g) {
		fmt.Fprintf(&b, "+ %4d   %s\n", i+1, g[i])
	} else {
		b.WriteString("+        (end of rendered chart)\n")
	}
	fmt.Fprintf(&b, "(golden %d lines, rendered %d lines)", len(w), len(g))
	return b.String()
}
