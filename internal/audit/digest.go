package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"strings"
)

// DigestPrefix names the digest's algorithm.
const DigestPrefix = "sha256:"

// ArgumentsDigest is "sha256:" and the hex SHA-256 of the canonical form of a call's arguments, so
// an auditor can tell which arguments ran without the trail holding them. The canonical form is the
// JSON re-encoded with object keys sorted (by code point), no whitespace between tokens, strings
// escaped as Go's encoding/json escapes them without HTML escaping, and numbers exactly as written;
// the same arguments with other key order or spacing give the same digest. Arguments that are not
// one JSON value (a truncated request shows them cut) are digested as the request holds them.
func ArgumentsDigest(arguments string) string {
	sum := sha256.Sum256(canonical(arguments))
	return DigestPrefix + hex.EncodeToString(sum[:])
}

func canonical(arguments string) []byte {
	dec := json.NewDecoder(strings.NewReader(arguments))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return []byte(arguments)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return []byte(arguments)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return []byte(arguments)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}
