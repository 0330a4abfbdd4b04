package api

// The API socket's front: the accept loop in front of net/http's server.
// An enforcer asks POST /v1/decide on one keep-alive connection, one request
// at a time, and waits for each answer; on that path net/http's
// per-request machinery (a read deadline armed for every header, whose
// runtime timer wakes the network poller's thread; a background-read
// goroutine started and aborted around every request; a cancelable
// context) cost more in hand-offs between threads than the decision
// itself (bench/README.md, sixth session). So a
// connection starts on a lean loop: while its next request begins with
// "POST /v1/decide ", the loop's goroutine reads it (net/http's request
// parser, http.ReadRequest), serves it through the same Server.ServeHTTP as
// every other call (caller check, body limit, routing, handler) and writes
// the buffered answer in one write. At the first other request the
// connection, with the bytes the loop has read but not used, goes to
// net/http's server for the rest of its life (events streams, runs,
// everything else).

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// decidePrefix starts every request the lean loop serves. It is shorter
// than any whole HTTP/1.x request, so peeking for it never waits on bytes a
// client will not send.
var decidePrefix = []byte("POST /v1/decide ")

// maxDrain is how much of a request body the handler left unread is read
// and discarded to keep the connection (net/http's own threshold); past it
// the connection is closed after the answer.
const maxDrain = 256 << 10

// Front serves the API socket: the lean loop for /v1/decide, net/http's
// server (hs) for the rest; both hand every request to the same handler.
type Front struct {
	h       http.Handler
	log     *slog.Logger
	hs      *http.Server
	ln      net.Listener
	handoff *chanListener

	mu     sync.Mutex
	conns  map[net.Conn]bool // lean connections: true while a request is served
	closed bool
	wg     sync.WaitGroup
}

// NewFront puts a front on ln: h (the API's Server) answers every request.
// hs is net/http's server for what the lean loop hands off; NewFront sets
// its Handler to h and its ConnContext to ConnContext (a handed-off
// connection keeps the credentials, and the caller check, of its lean
// loop). hs.ReadHeaderTimeout also bounds the lean loop's wait for a
// request's header once its first byte has arrived.
func NewFront(h http.Handler, ln net.Listener, hs *http.Server, log *slog.Logger) *Front {
	if log == nil {
		log = slog.Default()
	}
	hs.Handler = h
	hs.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if hc, ok := c.(*handedConn); ok { // the verdict made on the lean loop holds
			if cc := hc.ctx.Value(credsKey{}); cc != nil {
				return context.WithValue(ctx, credsKey{}, cc)
			}
			return ctx
		}
		return ConnContext(ctx, c)
	}
	return &Front{h: h, log: log, hs: hs, ln: ln, conns: map[net.Conn]bool{},
		handoff: &chanListener{addr: ln.Addr(), c: make(chan net.Conn), done: make(chan struct{})}}
}

// Serve accepts connections until Shutdown; it returns http.ErrServerClosed
// then, or the listener's error.
func (f *Front) Serve() error {
	hsErr := make(chan error, 1)
	go func() { hsErr <- f.hs.Serve(f.handoff) }()
	var delay time.Duration
	for {
		c, err := f.ln.Accept()
		if err != nil {
			f.mu.Lock()
			closed := f.closed
			f.mu.Unlock()
			if closed {
				<-hsErr
				return http.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				// Out of descriptors: back off as net/http does.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				f.log.Warn("api accept", "err", err, "retry_in", delay)
				time.Sleep(delay)
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			f.Shutdown(ctx)
			cancel()
			<-hsErr
			return err
		}
		delay = 0
		if uc, ok := c.(*net.UnixConn); ok {
			// Room for a few attach messages (the default, about 208
			// KiB, is less than one): a stream's write goes into the
			// socket at once instead of waking the agent and its client
			// for each part. A limit, not memory taken: only bytes the
			// client has not read yet count against it.
			uc.SetWriteBuffer(4 * attachFrameBytes)
		}
		if !f.track(c) {
			c.Close()
			continue
		}
		go f.serveConn(c)
	}
}

// Shutdown stops accepting, closes the lean connections that are between
// requests, waits (until ctx ends) for those serving one, and shuts down
// net/http's server (hs.Shutdown) for the handed-off ones.
func (f *Front) Shutdown(ctx context.Context) error {
	f.mu.Lock()
	if !f.closed {
		f.closed = true
		f.ln.Close()
		for c, busy := range f.conns {
			if !busy {
				c.Close()
			}
		}
	}
	f.mu.Unlock()
	done := make(chan struct{})
	go func() { f.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return f.hs.Shutdown(ctx)
}

// track registers a new lean connection and counts its loop (f.wg, under
// f.mu so that no loop is added once Shutdown waits); false once shut down.
func (f *Front) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = false
	f.wg.Add(1)
	return true
}

// setBusy marks a lean connection as serving a request (or not); false when
// the front is shutting down and the connection must close instead.
func (f *Front) setBusy(c net.Conn, busy bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = busy
	return true
}

func (f *Front) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
}

// serveConn is the lean loop of one connection.
func (f *Front) serveConn(c net.Conn) {
	defer f.wg.Done()
	handed := false
	defer func() {
		f.untrack(c)
		if !handed {
			c.Close()
		}
	}()
	ctx, cancel := context.WithCancel(ConnContext(context.Background(), c))
	defer cancel()
	cr := &limitedReader{r: c, n: -1}
	br := bufio.NewReaderSize(cr, 4<<10)
	lw := &leanWriter{h: http.Header{}}
	remote := c.RemoteAddr().String()
	var out []byte
	for {
		if _, err := br.Peek(1); err != nil { // idle until the next request
			return
		}
		if !f.setBusy(c, true) {
			return
		}
		// A request's header usually arrives whole, with its first byte:
		// then reading it cannot block, and no deadline (a runtime timer,
		// whose arming wakes the network poller's thread) is set.
		deadline := false
		if t := f.hs.ReadHeaderTimeout; t > 0 && !headerBuffered(br) {
			c.SetReadDeadline(time.Now().Add(t))
			deadline = true
		}
		p, err := br.Peek(len(decidePrefix))
		if err != nil || !bytes.Equal(p, decidePrefix) {
			// Another call (or something net/http must answer): the
			// connection is net/http's from here on.
			if deadline {
				c.SetReadDeadline(time.Time{})
			}
			f.untrack(c)
			hc := &handedConn{Conn: c, br: br, ctx: ctx}
			if f.handoff.give(hc) {
				handed = true
			}
			return
		}
		// The header is read under net/http's size limit (counted from the
		// request's first byte, with what the buffer holds ahead); the body
		// under the handler's own (http.MaxBytesReader).
		cr.n = int64(f.maxHeaderBytes()) + 4096 - int64(br.Buffered())
		req, err := http.ReadRequest(br)
		cr.n = -1
		if deadline {
			c.SetReadDeadline(time.Time{})
		}
		var ne net.Error
		switch {
		case err != nil && (errors.As(err, &ne) && ne.Timeout() || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)):
			return // the header stalled or the peer went: closed without an answer, as net/http does
		case errors.Is(err, errHeaderTooLarge):
			c.Write(plainError(http.StatusRequestHeaderFieldsTooLarge, "request header too large"))
			return
		case err != nil:
			c.Write(plainError(http.StatusBadRequest, "malformed request: "+err.Error()))
			return
		}
		keep, msg := f.serveOne(ctx, c, remote, req, lw)
		if asciiEqualFold(lw.h.Get("Connection"), "close") {
			keep = false
		}
		if msg != "" {
			out = plainError(lw.code, msg)
		} else {
			out = lw.appendResponse(out[:0], keep)
		}
		if _, err := c.Write(out); err != nil || !keep {
			return
		}
		if !f.setBusy(c, false) {
			return
		}
		lw.reset()
	}
}

// serveOne serves one request into lw. keep: the connection stays open.
// msg, when set, replaces the answer with a plain error (lw.code).
func (f *Front) serveOne(ctx context.Context, c net.Conn, remote string, req *http.Request, lw *leanWriter) (keep bool, msg string) {
	keep = !req.Close
	if req.ProtoAtLeast(1, 1) && req.Host == "" {
		lw.code = http.StatusBadRequest
		return false, "missing required Host header"
	}
	switch e := req.Header.Get("Expect"); {
	case e == "":
	case asciiEqualFold(e, "100-continue"):
		if req.ContentLength != 0 {
			if _, err := c.Write([]byte("HTTP/1.1 100 Continue\r\n\r\n")); err != nil {
				return false, ""
			}
		}
	default:
		lw.code = http.StatusExpectationFailed
		return false, "unsupported Expect header"
	}
	req.RemoteAddr = remote
	req = req.WithContext(ctx)
	body := req.Body
	defer func() {
		if r := recover(); r != nil {
			f.log.Error("api: panic serving a decision", "panic", fmt.Sprint(r))
			lw.code, keep, msg = http.StatusInternalServerError, false, "internal error"
		}
	}()
	f.h.ServeHTTP(lw, req)
	// Keep the connection only if the body was read to its end (or what is
	// left is small enough to discard), as net/http does.
	if n, err := io.CopyN(io.Discard, body, maxDrain+1); n > maxDrain || err != io.EOF {
		keep = false
	}
	body.Close()
	return keep, ""
}

// maxHeaderBytes is hs's limit on a request header, or net/http's default.
func (f *Front) maxHeaderBytes() int {
	if f.hs.MaxHeaderBytes > 0 {
		return f.hs.MaxHeaderBytes
	}
	return http.DefaultMaxHeaderBytes
}

var errHeaderTooLarge = errors.New("request header too large")

// limitedReader reads r, at most n more bytes while n >= 0 (then
// errHeaderTooLarge); n < 0: no limit.
type limitedReader struct {
	r io.Reader
	n int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n < 0 {
		return l.r.Read(p)
	}
	if l.n == 0 {
		return 0, errHeaderTooLarge
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}

// headerBuffered reports whether br holds a whole request header (up to
// its blank line).
func headerBuffered(br *bufio.Reader) bool {
	b, _ := br.Peek(br.Buffered())
	return bytes.Contains(b, []byte("\r\n\r\n"))
}

// leanWriter buffers one answer: status, header and body, written by
// appendResponse with its Content-Length.
type leanWriter struct {
	h           http.Header
	code        int
	wroteHeader bool
	body        []byte
}

func (w *leanWriter) Header() http.Header { return w.h }

func (w *leanWriter) WriteHeader(code int) {
	if w.wroteHeader {
		return
	}
	w.wroteHeader, w.code = true, code
}

func (w *leanWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	w.body = append(w.body, p...)
	return len(p), nil
}

func (w *leanWriter) reset() {
	clear(w.h)
	w.code, w.wroteHeader, w.body = 0, false, w.body[:0]
}

// appendResponse appends the HTTP/1.1 answer to b: status line, the
// handler's header fields in sorted order, Date, Content-Length, the body.
func (w *leanWriter) appendResponse(b []byte, keep bool) []byte {
	w.WriteHeader(http.StatusOK)
	b = fmt.Appendf(b, "HTTP/1.1 %03d %s\r\n", w.code, http.StatusText(w.code))
	keys := make([]string, 0, len(w.h))
	for k := range w.h {
		if k != "Content-Length" && k != "Date" && k != "Connection" && k != "Transfer-Encoding" {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		for _, v := range w.h[k] {
			b = append(b, k...)
			b = append(b, ": "...)
			b = append(b, headerValue(v)...)
			b = append(b, "\r\n"...)
		}
	}
	b = append(b, "Date: "...)
	b = append(b, httpDate()...)
	b = append(b, "\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(w.body)), 10)
	b = append(b, "\r\n"...)
	if !keep {
		b = append(b, "Connection: close\r\n"...)
	}
	b = append(b, "\r\n"...)
	return append(b, w.body...)
}

// headerValue drops the bytes that would end a header field.
func headerValue(v string) string {
	if !strings.ContainsAny(v, "\r\n") {
		return v
	}
	return strings.Map(func(r rune) rune {
		if r == '\r' || r == '\n' {
			return ' '
		}
		return r
	}, v)
}

// plainError is a whole answer that closes the connection.
func plainError(code int, msg string) []byte {
	w := &leanWriter{h: http.Header{}}
	writeErr(w, code, errors.New(msg)) // the API's error body, JSON-escaped
	body := w.body
	return fmt.Appendf(nil, "HTTP/1.1 %03d %s\r\nContent-Type: application/json\r\nDate: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		code, http.StatusText(code), httpDate(), len(body), body)
}

// httpDate is the Date header's value, formatted once a second.
func httpDate() string {
	now := time.Now()
	if d := dateCache.Load(); d != nil && d.sec == now.Unix() {
		return d.s
	}
	d := &cachedDate{sec: now.Unix(), s: now.UTC().Format(http.TimeFormat)}
	dateCache.Store(d)
	return d.s
}

type cachedDate struct {
	sec int64
	s   string
}

var dateCache atomic.Pointer[cachedDate]

func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// handedConn is a connection given to net/http: the bytes the lean loop
// read ahead come first; ctx carries the connection's credentials and the
// caller check already made on them.
type handedConn struct {
	net.Conn
	br  *bufio.Reader
	ctx context.Context
}

func (c *handedConn) Read(p []byte) (int, error) {
	if c.br != nil {
		if c.br.Buffered() > 0 {
			return c.br.Read(p)
		}
		c.br = nil
	}
	return c.Conn.Read(p)
}

// CloseWrite lets net/http half-close, as it does on the bare connection.
func (c *handedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// chanListener is the listener net/http's server accepts handed-off
// connections from.
type chanListener struct {
	addr net.Addr
	c    chan net.Conn
	once sync.Once
	done chan struct{}
}

// give hands c over; false (and c closed) once the listener is closed.
func (l *chanListener) give(c net.Conn) bool {
	select {
	case l.c <- c:
		return true
	case <-l.done:
		c.Close()
		return false
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.c:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }
