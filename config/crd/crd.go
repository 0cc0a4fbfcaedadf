// Package crd embeds floodgate's CustomResourceDefinitions, the files
// controller-gen generates into bases/ (make manifests), for programs that
// validate objects against them offline: kubectl floodgate check.
package crd

import "embed"

// Bases holds bases/*.yaml, one CustomResourceDefinition per file.
//
//go:embed bases/*.yaml
var Bases embed.FS
