package main

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotations of the image's entry in the archive's index.json. containerd
// (`ctr images import`, which `kind load image-archive` runs) names the
// imported image by annotationImageName; other OCI tools read the tag
// from annotationRefName.
const (
	annotationImageName = "io.containerd.image.name"
	annotationRefName   = "org.opencontainers.image.ref.name"
)

// dockerManifest is one entry of manifest.json, the index of `docker save`
// archives, which `docker load` reads.
type dockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// writeArchive writes img as an OCI image layout in a tar stream, named
// ref (a full reference with a tag). The archive also carries the
// manifest.json of `docker save`, so that `docker load`, `ctr images
// import`, `kind load image-archive` and `podman load` all take it. Every
// entry has the time mtime, so the same image always gives the same
// archive.
func writeArchive(w io.Writer, img v1.Image, ref string, mtime time.Time) error {
	tag := ref[strings.LastIndex(ref, ":")+1:]
	if i := strings.LastIndex(ref, ":"); i < 0 || strings.Contains(tag, "/") {
		return fmt.Errorf("image reference %q has no tag", ref)
	}
	manifest, err := img.RawManifest()
	if err != nil {
		return fmt.Errorf("manifest of %s: %w", ref, err)
	}
	mdigest, err := img.Digest()
	if err != nil {
		return fmt.Errorf("digest of %s: %w", ref, err)
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return fmt.Errorf("config of %s: %w", ref, err)
	}
	cdigest, err := img.ConfigName()
	if err != nil {
		return fmt.Errorf("config digest of %s: %w", ref, err)
	}
	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("layers of %s: %w", ref, err)
	}
	index := v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType:   types.OCIManifestSchema1,
			Digest:      mdigest,
			Size:        int64(len(manifest)),
			Annotations: map[string]string{annotationImageName: ref, annotationRefName: tag},
		}},
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return err
	}
	blob := func(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }
	docker := dockerManifest{Config: blob(cdigest), RepoTags: []string{ref}}

	tw := tar.NewWriter(w)
	add := func(name string, mode int64, size int64, body io.Reader) error {
		h := &tar.Header{Name: name, Mode: mode, Size: size, ModTime: mtime, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if strings.HasSuffix(name, "/") {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("archive entry %s: %w", name, err)
		}
		if body != nil {
			if _, err := io.Copy(tw, body); err != nil {
				return fmt.Errorf("archive entry %s: %w", name, err)
			}
		}
		return nil
	}
	addBytes := func(name string, b []byte) error {
		return add(name, 0o644, int64(len(b)), strings.NewReader(string(b)))
	}
	if err := addBytes("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := addBytes("index.json", indexJSON); err != nil {
		return err
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := add(d, 0o755, 0, nil); err != nil {
			return err
		}
	}
	if err := addBytes(blob(cdigest), config); err != nil {
		return err
	}
	if err := addBytes(blob(mdigest), manifest); err != nil {
		return err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return fmt.Errorf("layer digest of %s: %w", ref, err)
		}
		size, err := l.Size()
		if err != nil {
			return fmt.Errorf("layer size of %s: %w", ref, err)
		}
		rc, err := l.Compressed()
		if err != nil {
			return fmt.Errorf("layer of %s: %w", ref, err)
		}
		err = add(blob(d), 0o644, size, rc)
		_ = rc.Close()
		if err != nil {
			return err
		}
		docker.Layers = append(docker.Layers, blob(d))
	}
	dockerJSON, err := json.Marshal([]dockerManifest{docker})
	if err != nil {
		return err
	}
	if err := addBytes("manifest.json", dockerJSON); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("closing the archive of %s: %w", ref, err)
	}
	return nil
}
