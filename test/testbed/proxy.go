package testbed

import (
	"errors"
	"io"
	"net"
	"sync"
)

// Proxy passes TCP connections from a loopback address of its own to target, so that a test
// can cut the network between a client and a server: Cut closes every connection and refuses
// new ones until Restore.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	done  sync.WaitGroup
}

// NewProxy listens on 127.0.0.1 and passes what it accepts to target until Close.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.done.Go(p.accept)
	return p, nil
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.done.Go(func() { p.pass(c) })
	}
}

// pass copies between c and a connection to the target, both ways, until either ends.
func (p *Proxy) pass(c net.Conn) {
	if !p.track(c) {
		c.Close()
		return
	}
	defer p.untrack(c)
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(s) {
		s.Close()
		c.Close()
		return
	}
	defer p.untrack(s)
	var copies sync.WaitGroup
	half := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src) // ends when either side closes: the cut, or the peers
		dst.Close()
		src.Close()
	}
	copies.Go(func() { half(s, c) })
	copies.Go(func() { half(c, s) })
	copies.Wait()
}

// track notes c as open, unless the network is cut.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

// Cut closes every connection through the proxy, and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// Restore lets connections through again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

// Close stops listening, closes every connection and waits for the proxy's goroutines.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.Cut()
	p.done.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
