package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

var epoch = time.Unix(1700000000, 0).UTC()

// readTar returns the entries of a tar stream by name.
func readTar(t *testing.T, r io.Reader) (map[string]*tar.Header, map[string][]byte, []string) {
	t.Helper()
	heads, bodies := map[string]*tar.Header{}, map[string][]byte{}
	var order []string
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return heads, bodies, order
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		heads[h.Name], bodies[h.Name] = h, b
		order = append(order, h.Name)
	}
}

func TestLayerTarAddsParentsSortsAndIsReproducible(t *testing.T) {
	t.Parallel()
	files := []file{
		{Path: "/usr/bin/tool", Mode: 0o755, Data: []byte("bin")},
		{Path: "/data", Dir: true, Mode: 0o770, UID: 999, GID: 999},
		{Path: "/bin", Link: "usr/bin"},
	}
	a, err := layerTar(files, epoch)
	if err != nil {
		t.Fatal(err)
	}
	b, err := layerTar([]file{files[2], files[0], files[1]}, epoch)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Error("the same files in another order give another layer")
	}
	heads, bodies, order := readTar(t, bytes.NewReader(a))
	if got, want := strings.Join(order, " "), "bin data/ usr/ usr/bin/ usr/bin/tool"; got != want {
		t.Errorf("entries %q, want %q", got, want)
	}
	if h := heads["data/"]; h.Uid != 999 || h.Mode != 0o770 || h.Typeflag != tar.TypeDir {
		t.Errorf("data/: uid %d mode %o type %c", h.Uid, h.Mode, h.Typeflag)
	}
	if h := heads["bin"]; h.Typeflag != tar.TypeSymlink || h.Linkname != "usr/bin" {
		t.Errorf("bin: type %c link %q", h.Typeflag, h.Linkname)
	}
	if got, want := string(bodies["usr/bin/tool"]), "bin"; got != want {
		t.Errorf("tool: %q, want %q", got, want)
	}
	for name, h := range heads {
		if !h.ModTime.Equal(epoch) {
			t.Errorf("%s: time %v, want %v", name, h.ModTime, epoch)
		}
	}
}

func TestLayerTarRejectsBadPaths(t *testing.T) {
	t.Parallel()
	for name, files := range map[string][]file{
		"relative": {{Path: "etc/passwd", Data: []byte("x")}},
		"twice":    {{Path: "/a", Data: []byte("x")}, {Path: "/a", Data: []byte("y")}},
		"file dir": {{Path: "/a", Data: []byte("x")}, {Path: "/a/b", Data: []byte("y")}},
	} {
		if _, err := layerTar(files, epoch); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// fakeBinaries writes stand-ins for the go build outputs.
func fakeBinaries(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, bs := range binaries {
		for _, b := range bs {
			if err := os.WriteFile(filepath.Join(dir, b[0]), []byte("#!binary "+b[0]), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

func TestSpecsRunAsNonRootUnderReleaseNames(t *testing.T) {
	t.Parallel()
	bins := fakeBinaries(t)
	for _, tc := range []struct {
		name, user, entrypoint string
		paths                  []string
	}{
		{"floodgate-manager", "65532:65532", "/floodgate-manager", []string{"/floodgate-manager", "/floodgate-sidecar", "/etc/passwd", "/tmp", "/etc/ssl/certs/ca-certificates.crt"}},
		{"floodgate-sidecar", "65532:65532", "/floodgate-sidecar", []string{"/floodgate-sidecar", "/etc/passwd", "/tmp"}},
		{"floodgate-sample-backend", "65532:65532", "/floodgate-sample-backend", []string{"/floodgate-sample-backend"}},
		{"floodgate-pause", "65535:65535", "/pause", []string{"/pause"}},
	} {
		s, err := specFor(tc.name, "9.8.7", bins, epoch)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got, want := s.Ref, "ghcr.io/floodgate-dev/"+tc.name+":9.8.7"; got != want {
			t.Errorf("%s: ref %q, want %q", tc.name, got, want)
		}
		if got, want := s.Config.User, tc.user; got != want {
			t.Errorf("%s: user %q, want %q", tc.name, got, want)
		}
		if got, want := strings.Join(s.Config.Entrypoint, " "), tc.entrypoint; got != want {
			t.Errorf("%s: entrypoint %q, want %q", tc.name, got, want)
		}
		if got, want := s.Config.Labels["org.opencontainers.image.version"], "9.8.7"; got != want {
			t.Errorf("%s: version label %q, want %q", tc.name, got, want)
		}
		have := map[string]bool{}
		for _, f := range s.Files {
			have[f.Path] = true
		}
		for _, p := range tc.paths {
			if !have[p] {
				t.Errorf("%s: no %s", tc.name, p)
			}
		}
	}
	if _, err := specFor("floodgate-nothing", "1", bins, epoch); err == nil {
		t.Error("an unknown image gave no error")
	}
}

func TestArchiveIsAnOCILayoutAndADockerArchive(t *testing.T) {
	t.Parallel()
	s, err := specFor("floodgate-sidecar", "9.8.7", fakeBinaries(t), epoch)
	if err != nil {
		t.Fatal(err)
	}
	img, err := build(s, "amd64", epoch)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := writeArchive(&buf, img, s.Ref, epoch); err != nil {
		t.Fatal(err)
	}
	var again bytes.Buffer
	if err := writeArchive(&again, img, s.Ref, epoch); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Error("writing the same image twice gave two archives")
	}
	_, bodies, _ := readTar(t, &buf)
	for name, b := range bodies {
		if !strings.HasPrefix(name, "blobs/sha256/") || strings.HasSuffix(name, "/") {
			continue
		}
		sum := sha256.Sum256(b)
		if got, want := hex.EncodeToString(sum[:]), strings.TrimPrefix(name, "blobs/sha256/"); got != want {
			t.Errorf("blob %s has digest %s", name, got)
		}
	}
	if got, want := string(bodies["oci-layout"]), `{"imageLayoutVersion":"1.0.0"}`; got != want {
		t.Errorf("oci-layout %q, want %q", got, want)
	}
	var index v1.IndexManifest
	if err := json.Unmarshal(bodies["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	if len(index.Manifests) != 1 {
		t.Fatalf("index has %d manifests, want 1", len(index.Manifests))
	}
	d := index.Manifests[0]
	if got, want := d.Annotations[annotationImageName], s.Ref; got != want {
		t.Errorf("containerd name %q, want %q", got, want)
	}
	if got, want := d.Annotations[annotationRefName], "9.8.7"; got != want {
		t.Errorf("ref name %q, want %q", got, want)
	}
	var m v1.Manifest
	if err := json.Unmarshal(bodies["blobs/sha256/"+d.Digest.Hex], &m); err != nil {
		t.Fatal(err)
	}
	var cf v1.ConfigFile
	if err := json.Unmarshal(bodies["blobs/sha256/"+m.Config.Digest.Hex], &cf); err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" || cf.Config.User != "65532:65532" {
		t.Errorf("config: os %q arch %q user %q", cf.OS, cf.Architecture, cf.Config.User)
	}
	if len(m.Layers) != 1 || len(cf.RootFS.DiffIDs) != 1 {
		t.Fatalf("%d layers, %d diff ids; want 1", len(m.Layers), len(cf.RootFS.DiffIDs))
	}
	zr, err := gzip.NewReader(bytes.NewReader(bodies["blobs/sha256/"+m.Layers[0].Digest.Hex]))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	if got, want := hex.EncodeToString(sum[:]), cf.RootFS.DiffIDs[0].Hex; got != want {
		t.Errorf("layer diff id %s, config says %s", got, want)
	}
	heads, _, _ := readTar(t, bytes.NewReader(raw))
	if h := heads["floodgate-sidecar"]; h == nil || h.Mode != 0o755 {
		t.Errorf("the layer lacks an executable /floodgate-sidecar: %+v", h)
	}
	var docker []dockerManifest
	if err := json.Unmarshal(bodies["manifest.json"], &docker); err != nil {
		t.Fatal(err)
	}
	if len(docker) != 1 || len(docker[0].RepoTags) != 1 || docker[0].RepoTags[0] != s.Ref ||
		docker[0].Config != "blobs/sha256/"+m.Config.Digest.Hex || len(docker[0].Layers) != 1 {
		t.Errorf("manifest.json %+v", docker)
	}
}

func TestWriteArchiveNeedsATag(t *testing.T) {
	t.Parallel()
	s, err := specFor("floodgate-pause", "1", fakeBinaries(t), epoch)
	if err != nil {
		t.Fatal(err)
	}
	img, err := build(s, "amd64", epoch)
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"ghcr.io/floodgate-dev/floodgate-pause", "localhost:5000/pause"} {
		if err := writeArchive(io.Discard, img, ref, epoch); err == nil {
			t.Errorf("%s: no error", ref)
		}
	}
}

// TestDockerfileBuildsTheSameImages checks that the Dockerfile's final
// stages give the manager and sidecar images the files, user, entrypoint
// and labels that this builder gives them.
func TestDockerfileBuildsTheSameImages(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	stages := map[string]string{}
	for _, stage := range strings.Split(string(raw), "\nFROM ")[1:] {
		head, body, _ := strings.Cut(stage, "\n")
		if _, name, ok := strings.Cut(head, " AS "); ok {
			stages[strings.TrimSpace(name)] = strings.ReplaceAll(body, "\\\n", " ")
		}
	}
	bins := fakeBinaries(t)
	for _, name := range []string{"floodgate-manager", "floodgate-sidecar"} {
		stage, ok := stages[name]
		if !ok {
			t.Fatalf("the Dockerfile has no stage %s", name)
		}
		s, err := specFor(name, "0.1.0", bins, epoch)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{
			"USER " + s.Config.User,
			`ENTRYPOINT ["` + s.Config.Entrypoint[0] + `"]`,
		}
		for _, b := range binaries[name] {
			want = append(want, "COPY --from=build /out/"+b[0]+" "+b[1])
		}
		for _, k := range []string{"title", "description", "source", "url", "licenses", "vendor"} {
			key := "org.opencontainers.image." + k
			want = append(want, key+`="`+s.Config.Labels[key]+`"`)
		}
		for _, w := range want {
			if !strings.Contains(stage, w) {
				t.Errorf("Dockerfile stage %s lacks %s", name, w)
			}
		}
	}
}
