package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"sigs.k8s.io/yaml"
)

// MaxDocumentSize bounds the size of a document Parse accepts. A ConfigMap
// holds at most 1 MiB, so a larger document is never legitimate.
const MaxDocumentSize = 4 << 20

// Values of Rule.OnMissingKey.
const (
	OnMissingKeySkip   = "Skip"
	OnMissingKeyShared = "Shared"
	OnMissingKeyReject = "Reject"
)

// Values of JWT.OnInvalidToken.
const (
	OnInvalidTokenReject          = "Reject"
	OnInvalidTokenNextAlternative = "NextAlternative"
)

// Values of Rule.FailureMode.
const (
	FailureOpen   = "Open"
	FailureClosed = "Closed"
)

// Values of Rule.ResponseHeaders.
const (
	ResponseHeadersFull       = "Full"
	ResponseHeadersRetryAfter = "RetryAfter"
	ResponseHeadersNone       = "None"
)

// Values of Rule.Mode.
const (
	ModeEnforce = "Enforce"
	ModeShadow  = "Shadow"
)

// Parse decodes a document in YAML or JSON (JSON is YAML) strictly: unknown
// fields, duplicate keys and trailing documents are errors. Parse does not
// validate; call Validate on the result.
func Parse(data []byte) (*Config, error) {
	if len(data) > MaxDocumentSize {
		return nil, fmt.Errorf("parse sidecar config: document is %d bytes, the limit is %d", len(data), MaxDocumentSize)
	}
	var c Config
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return nil, fmt.Errorf("parse sidecar config: %w", err)
	}
	return &c, nil
}

// Load parses and validates a document, and fills Revision from the
// document's Digest when the document has none.
func Load(data []byte) (*Config, error) {
	c, err := Parse(data)
	if err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.Revision == "" {
		c.Revision = Digest(data)
	}
	return c, nil
}

// Digest returns a short content hash of a document, used as its revision
// when the document does not name one.
func Digest(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// PeekStore returns the store a JSON document names (its "store" field),
// reading no further: the manager writes the store before the policies, so
// a large document costs only its first bytes. It neither validates the
// document nor reads YAML; a document without a store gives the zero
// Store. The manager reads the stores of every namespace's ConfigMap with
// it, on each change of one.
func PeekStore(data []byte) (Store, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if t, err := dec.Token(); err != nil {
		return Store{}, fmt.Errorf("peek the store of a sidecar config: %w", err)
	} else if t != json.Delim('{') {
		return Store{}, errors.New("peek the store of a sidecar config: not a JSON object")
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return Store{}, fmt.Errorf("peek the store of a sidecar config: %w", err)
		}
		if key, _ := t.(string); key != "store" {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return Store{}, fmt.Errorf("peek the store of a sidecar config: field %q: %w", key, err)
			}
			continue
		}
		var s Store
		if err := dec.Decode(&s); err != nil {
			return Store{}, fmt.Errorf("peek the store of a sidecar config: field \"store\": %w", err)
		}
		return s, nil
	}
	return Store{}, nil
}
