package enrol

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"

	"sandstorm/api"
	"sandstorm/internal/httpjson"
	"sandstorm/internal/pki"
)

// renewal is a node's end of its certificate's renewal by the master
// (Renew), the same for a node the master dials (Endpoint, a server
// certificate) and one that dials it (Joiner, a client certificate): the
// master asks for a CSR (POST /node/v1/renew), the node makes a new key
// and keeps it until the certificate for it comes (PUT /node/v1/cert),
// which it takes only if it is for that key and from its master's CA.
type renewal struct {
	mu  sync.Mutex
	key []byte // PEM, until its certificate comes
}

// serveCSR answers POST /node/v1/renew for node name.
func (rn *renewal) serveCSR(w http.ResponseWriter, name string) {
	csr, keyPEM, err := pki.NewCSR("node " + name)
	if err != nil {
		httpjson.Write(w, http.StatusInternalServerError, api.Error{Code: api.CodeInternal, Message: err.Error()})
		return
	}
	rn.mu.Lock()
	rn.key = keyPEM
	rn.mu.Unlock()
	httpjson.Write(w, http.StatusOK, pairReply{Name: name, CSR: csr})
}

// serveCert answers PUT /node/v1/cert: it checks the certificate (for
// the renewal's key, from the CA in pkiDir, for usage), writes it and the
// key to pkiDir, and returns it; on a refusal it has answered and ok is
// false. The caller answers 204 once it has put the pair to use.
func (rn *renewal) serveCert(w http.ResponseWriter, r *http.Request, pkiDir string, usage x509.ExtKeyUsage) (pair tls.Certificate, leaf *x509.Certificate, ok bool) {
	refuse := func(status int, code, msg string) {
		httpjson.Write(w, status, api.Error{Code: code, Message: msg})
	}
	var f pairFinish
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&f); err != nil {
		refuse(http.StatusBadRequest, api.CodeBadRequest, "malformed certificate")
		return
	}
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if rn.key == nil {
		refuse(http.StatusConflict, api.CodeConflict, "no renewal asked for")
		return
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.Cert})
	pair, err := tls.X509KeyPair(certPEM, rn.key)
	if err != nil {
		refuse(http.StatusBadRequest, api.CodeBadRequest, "the certificate is not for the renewal's key: "+err.Error())
		return
	}
	caPEM, _ := os.ReadFile(filepath.Join(pkiDir, nodeCAFile))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
		refuse(http.StatusBadRequest, api.CodeBadRequest, err.Error())
		return
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		refuse(http.StatusBadRequest, api.CodeBadRequest, "the certificate is not from this node's master's CA for its use: "+err.Error())
		return
	}
	if err := writePKI(pkiDir, pkiFile{nodeKeyFile, rn.key, 0o600}, pkiFile{nodeCertFile, certPEM, 0o644}); err != nil {
		refuse(http.StatusInternalServerError, api.CodeInternal, err.Error())
		return
	}
	rn.key = nil
	return pair, leaf, true
}

// reset drops a renewal asked for (the node was unpaired).
func (rn *renewal) reset() {
	rn.mu.Lock()
	rn.key = nil
	rn.mu.Unlock()
}
