package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// file is one entry of an image's file system.
type file struct {
	// Path is absolute inside the image.
	Path string
	// Mode holds the permission bits (and sticky bit).
	Mode int64
	// UID and GID own the entry.
	UID, GID int
	// Data is a regular file's content.
	Data []byte
	// Dir marks a directory.
	Dir bool
	// Link is a symbolic link's target.
	Link string
}

// imageSpec describes one image.
type imageSpec struct {
	// Name is the image's short name, which is also its archive's name
	// (floodgate-sidecar).
	Name string
	// Ref is the full reference the archive names the image by
	// (ghcr.io/floodgate-dev/floodgate-sidecar:0.1.0).
	Ref string
	// Files is the single layer's content; parent directories are added.
	Files []file
	// Config is the image's run configuration (user, entrypoint, env,
	// labels, ports).
	Config v1.Config
}

// layerTar writes files as an uncompressed tar, sorted by path, with every
// missing parent directory added (root-owned, 0755) and every time set to
// mtime, so that the same files always give the same bytes and digests.
func layerTar(files []file, mtime time.Time) ([]byte, error) {
	byPath := map[string]file{}
	for _, f := range files {
		p := path.Clean(f.Path)
		if !path.IsAbs(p) || p == "/" {
			return nil, fmt.Errorf("image path %q: must be absolute and not /", f.Path)
		}
		if old, ok := byPath[p]; ok && (!old.Dir || !f.Dir) {
			return nil, fmt.Errorf("image path %s: given twice", p)
		}
		f.Path = p
		byPath[p] = f
	}
	for p := range byPath {
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if f, ok := byPath[d]; ok {
				if !f.Dir {
					return nil, fmt.Errorf("image path %s: its parent %s is not a directory", p, d)
				}
				continue
			}
			byPath[d] = file{Path: d, Dir: true, Mode: 0o755}
		}
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		f := byPath[p]
		h := &tar.Header{
			Name:    strings.TrimPrefix(p, "/"),
			Mode:    f.Mode,
			Uid:     f.UID,
			Gid:     f.GID,
			ModTime: mtime,
			Format:  tar.FormatPAX,
		}
		switch {
		case f.Dir:
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case f.Link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, f.Link, 0o777
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", p, err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Data); err != nil {
				return nil, fmt.Errorf("layer entry %s: %w", p, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("closing the layer: %w", err)
	}
	return buf.Bytes(), nil
}

// build assembles the image of s: an OCI image of one layer on an empty
// base, for linux/arch, created at created.
func build(s imageSpec, arch string, created time.Time) (v1.Image, error) {
	raw, err := layerTar(s.Files, created)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.Name, err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(raw)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("%s: layer: %w", s.Name, err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: created}, CreatedBy: "floodgate hack/images: " + s.Name},
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.Name, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("%s: config: %w", s.Name, err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = arch, "linux"
	cf.Config = s.Config
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, fmt.Errorf("%s: config: %w", s.Name, err)
	}
	if img, err = mutate.CreatedAt(img, v1.Time{Time: created}); err != nil {
		return nil, fmt.Errorf("%s: created: %w", s.Name, err)
	}
	return img, nil
}
