package main

import (
	"maps"
	"testing"
)

func TestTest2jsonOutcomes(t *testing.T) {
	got, err := test2jsonOutcomes("testdata/test2json.json")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]outcome{
		"TestOK":      {state: "pass"},
		"TestBad/sub": {state: "fail", message: "x_test.go:4: boom here"},
		"TestBad":     {state: "fail"},
		"TestSkip":    {state: "skip", message: "x_test.go:5: no"},
	}
	if !maps.Equal(got, want) {
		t.Errorf("outcomes = %v, want %v", got, want)
	}
}

func TestGinkgoOutcomes(t *testing.T) {
	got, err := ginkgoOutcomes("testdata/ginkgo.json")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]outcome{
		"kubectl floodgate status shows which pods enforce which revision": {state: "fail", message: "Expected (failed at status_test.go:182)"},
		"the loop converges":  {state: "pass"},
		"the loop is pending": {state: "skip"},
		"[AfterSuite]":        {state: "fail", message: "timed out (timedout at suite_test.go:9)"},
	}
	if !maps.Equal(got, want) {
		t.Errorf("outcomes:\n%v\nwant\n%v", got, want)
	}
}

func TestOutcomesOfAnEmptyRunAreAnError(t *testing.T) {
	// A binary that crashed before any test reported leaves no outcome:
	// that must not read as a clean run.
	if _, err := test2jsonOutcomes("main.go"); err == nil {
		t.Error("a file with no test events gave outcomes")
	}
}

func TestModuleOf(t *testing.T) {
	t.Chdir("../..") // the repository's root, as make test-flakes runs it
	for _, tc := range []struct{ pkg, dir, rel string }{
		{"./test/faults", ".", "./test/faults"},
		{"./client", "client", "./."},
		{"./client/grpcclient", "client/grpcclient", "./."},
	} {
		if dir, rel := moduleOf(tc.pkg); dir != tc.dir || rel != tc.rel {
			t.Errorf("moduleOf(%q) = %q, %q; want %q, %q", tc.pkg, dir, rel, tc.dir, tc.rel)
		}
	}
}
