package envdlink

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"connectrpc.com/connect"
)

// A call cut mid-answer (Link.Cut: a snapshot, a pause, a move, a detach,
// a delete) would otherwise end as a torn connection, which a Connect
// client (envd's: E2B's SDKs, connect-go) reports as "protocol error:
// incomplete envelope". When the answer is a Connect stream and the cut
// falls between two of its messages, cutWriter ends it the way the
// Connect protocol ends a stream that failed: an end-of-stream message
// carrying the error (https://connectrpc.com/docs/protocol/, "Streaming
// Response"), so the client reads "unavailable: sandbox … was moved"
// and may call again.

// ErrKilled marks a Cut's reason as a kill (a delete): the calls' streams
// are torn rather than ended, as E2B's own proxy tears them when a
// sandbox is killed. Its SDK reads a torn stream by asking the sandbox's
// health, and says it was killed when it is gone (its test "killing the
// sandbox while a command is running throws an actionable error" wants
// that error, not ours).
var ErrKilled = errors.New("the sandbox was killed")

// connectEndStream is the flag of the Connect protocol's end-of-stream
// message; every message is a flags byte and a big-endian length.
const (
	connectEndStream = 0x02
	connectHeadLen   = 5
)

// cutWriter is the answer's writer, tracking where the Connect stream it
// carries (if it does) is between messages.
type cutWriter struct {
	http.ResponseWriter
	wrote  bool // the answer's status was sent
	stream bool // the answer is a Connect stream
	head   [connectHeadLen]byte
	headN  int    // bytes of the current message's head seen
	left   uint32 // bytes of the current message's data still to come
	ended  bool   // the stream's own end-of-stream message passed
}

func (c *cutWriter) WriteHeader(code int) {
	if code >= http.StatusOK && !c.wrote {
		c.wrote = true
		c.stream = code == http.StatusOK && strings.HasPrefix(c.Header().Get("Content-Type"), "application/connect+")
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *cutWriter) Write(p []byte) (int, error) {
	if !c.wrote {
		c.WriteHeader(http.StatusOK)
	}
	n, err := c.ResponseWriter.Write(p)
	if c.stream {
		c.track(p[:n])
	}
	return n, err
}

// Unwrap lets http.ResponseController (the proxy's flushes) reach the
// server's writer.
func (c *cutWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// track follows the messages' framing over p, the next bytes written.
func (c *cutWriter) track(p []byte) {
	for len(p) > 0 {
		if c.left > 0 {
			k := min(uint32(len(p)), c.left)
			c.left -= k
			p = p[k:]
			continue
		}
		k := copy(c.head[c.headN:], p)
		c.headN += k
		p = p[k:]
		if c.headN == connectHeadLen {
			c.ended = c.ended || c.head[0]&connectEndStream != 0
			c.left = binary.BigEndian.Uint32(c.head[1:])
			c.headN = 0
		}
	}
}

// end ends the Connect stream with cause as its error, if the answer is
// one, is between two messages and has not ended; it says whether it
// did. Otherwise the connection is torn, as before.
func (c *cutWriter) end(cause error) bool {
	if !c.stream || c.ended || c.headN != 0 || c.left != 0 || errors.Is(cause, ErrKilled) {
		return false
	}
	// Unavailable whatever the cause, as E2B's own proxy ends a stream
	// whose sandbox died (tiering.CutReason says why).
	msg, err := json.Marshal(map[string]any{"error": map[string]string{"code": connect.CodeUnavailable.String(), "message": cause.Error()}})
	if err != nil {
		return false
	}
	out := make([]byte, connectHeadLen, connectHeadLen+len(msg))
	out[0] = connectEndStream
	binary.BigEndian.PutUint32(out[1:], uint32(len(msg)))
	if _, err := c.ResponseWriter.Write(append(out, msg...)); err != nil {
		return false
	}
	c.ended = true
	http.NewResponseController(c.ResponseWriter).Flush()
	return true
}
