package interpreter

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"

	"sandstorm/internal/errdefs"
)

// The Jupyter messaging protocol (version 5.3) on the wire: a multipart
// ZeroMQ message of routing identities, the delimiter, an HMAC-SHA256 of
// the four JSON parts that follow (hex), then header, parent header,
// metadata and content, then optional binary buffers. The key is the
// connection file's; a kernel drops messages whose signature is wrong,
// and so does this client.

// protocolVersion is the messaging protocol version the client speaks.
const protocolVersion = "5.3"

// delimiter separates routing identities from the signed message.
var delimiter = []byte("<IDS|MSG>")

// header is a message's header (and, as parentHeader, its parent's).
type header struct {
	MsgID    string `json:"msg_id"`
	Session  string `json:"session"`
	Username string `json:"username"`
	Date     string `json:"date"`
	MsgType  string `json:"msg_type"`
	Version  string `json:"version"`
}

// message is one decoded Jupyter message; content stays raw, decoded by
// whoever knows its msg_type.
type message struct {
	Header   header
	Parent   header
	Metadata json.RawMessage
	Content  json.RawMessage
}

// signer signs and verifies messages with one kernel's key.
type signer struct {
	key     []byte
	session string
}

// newID is a random identifier in the form Jupyter uses (UUID-like hex).
func newID() string {
	var b [16]byte
	rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func (s signer) sign(parts ...[]byte) []byte {
	if len(s.key) == 0 {
		return nil // an empty key means signing is off
	}
	m := hmac.New(sha256.New, s.key)
	for _, p := range parts {
		m.Write(p)
	}
	return []byte(hex.EncodeToString(m.Sum(nil)))
}

// encode builds the frames of a new message of msgType with content.
func (s signer) encode(msgType string, content any) (id string, frames [][]byte, err error) {
	id = newID()
	h, err := json.Marshal(header{
		MsgID: id, Session: s.session, Username: "sandstorm", MsgType: msgType,
		Version: protocolVersion, Date: time.Now().UTC().Format(time.RFC3339Nano),
	})
	if err != nil {
		return "", nil, err
	}
	c, err := json.Marshal(content)
	if err != nil {
		return "", nil, err
	}
	parent, meta := []byte("{}"), []byte("{}")
	return id, [][]byte{delimiter, s.sign(h, parent, meta, c), h, parent, meta, c}, nil
}

// decode parses frames received from a kernel (any routing identities or
// SUB topic first), checking the signature.
func (s signer) decode(frames [][]byte) (message, error) {
	i := 0
	for i < len(frames) && !bytes.Equal(frames[i], delimiter) {
		i++
	}
	if len(frames) < i+6 {
		return message{}, errdefs.New(errdefs.ErrBadInput, "interpreter: kernel message of %d frames has no delimiter or is short", len(frames))
	}
	sig, parts := frames[i+1], frames[i+2:i+6]
	if want := s.sign(parts...); !hmac.Equal(sig, want) {
		return message{}, errdefs.New(errdefs.ErrBadInput, "interpreter: kernel message with a bad signature")
	}
	var m message
	if err := json.Unmarshal(parts[0], &m.Header); err != nil {
		return message{}, errdefs.New(errdefs.ErrBadInput, "interpreter: message header: %v", err)
	}
	// A parent header is {} on messages that answer nothing.
	if err := json.Unmarshal(parts[1], &m.Parent); err != nil {
		return message{}, errdefs.New(errdefs.ErrBadInput, "interpreter: parent header: %v", err)
	}
	m.Metadata, m.Content = parts[2], parts[3]
	return m, nil
}
