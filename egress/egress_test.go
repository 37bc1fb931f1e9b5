package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestEveryRefusedClassIsRefusedAndPublicAddressesPass classifies addresses without dialling
// any of them.
func TestEveryRefusedClassIsRefusedAndPublicAddressesPass(t *testing.T) {
	p := &Policy{}
	for _, tt := range []struct {
		addr, class string // class "": allowed
	}{
		{"127.0.0.1", "loopback"},
		{"127.0.0.2", "loopback"},
		{"::1", "loopback"},
		{"::ffff:127.0.0.1", "loopback"}, // IPv4-mapped
		{"0.0.0.0", "unspecified"},
		{"::", "unspecified"},
		{"169.254.169.254", "link-local"}, // AWS, GCP, Azure metadata
		{"fe80::1", "link-local"},
		{"fd00:ec2::254", "private"}, // AWS metadata over IPv6
		{"10.96.0.1", "private"},     // a typical Service ClusterIP
		{"172.16.0.10", "private"},
		{"172.31.255.255", "private"},
		{"192.168.1.1", "private"},
		{"100.64.0.1", "shared"},
		{"100.100.100.200", "shared"}, // Alibaba Cloud metadata
		{"224.0.0.1", "multicast"},
		{"ff02::1", "multicast"},
		{"255.255.255.255", "reserved"},
		{"64:ff9b::a00:1", "NAT64"}, // 10.0.0.1 through NAT64
		{"2002:a00:1::1", "6to4"},
		{"8.8.8.8", ""},
		{"172.32.0.1", ""},
		{"2001:4860:4860::8888", ""},
		{"::ffff:8.8.8.8", ""},
	} {
		err := p.Check(netip.MustParseAddr(tt.addr))
		switch {
		case tt.class == "" && err != nil:
			t.Errorf("%s: refused: %v", tt.addr, err)
		case tt.class != "" && (err == nil || !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tt.class)):
			t.Errorf("%s: %v, want refused as %s", tt.addr, err, tt.class)
		}
	}
}

func TestTheOperatorsDenyWinsOverItsAllowWhichWinsOverTheDefaults(t *testing.T) {
	p := &Policy{
		Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("10.0.0.0/8")},
		Deny:  []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("203.0.113.0/24")},
	}
	for addr, allowed := range map[string]bool{
		"127.0.0.1": true, "127.0.0.2": false, "10.1.2.3": true, "10.96.0.1": false, "203.0.113.7": false, "8.8.8.8": true, "::ffff:127.0.0.1": true,
	} {
		if err := p.Check(netip.MustParseAddr(addr)); (err == nil) != allowed {
			t.Errorf("%s: %v, want allowed %v", addr, err, allowed)
		}
	}
}

func TestControlDecidesOnTheDialledAddress(t *testing.T) {
	p := &Policy{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}
	for address, allowed := range map[string]bool{
		"127.0.0.1:443": true, "127.0.0.2:443": false, "[::1]:443": false, "[fe80::1%eth0]:80": false, "169.254.169.254:80": false, "not an address": false,
	} {
		if err := p.Control("tcp", address, nil); (err == nil) != allowed {
			t.Errorf("Control(%s): %v, want allowed %v", address, err, allowed)
		}
	}
	// Through a dialer, over loopback only: a name resolving to a refused address is refused
	// before any packet leaves, and an allowed one connects.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	d := &net.Dialer{Timeout: 5 * time.Second, Control: p.Control}
	c, err := d.DialContext(context.Background(), "tcp", "127.0.0.1:"+port)
	if err != nil {
		t.Fatalf("dial the allowed 127.0.0.1: %v", err)
	}
	c.Close()
	deny := &net.Dialer{Timeout: 5 * time.Second, Control: (&Policy{}).Control}
	if _, err := deny.DialContext(context.Background(), "tcp", "localhost:"+port); !errors.Is(err, ErrRefused) {
		t.Errorf("dial localhost with nothing allowed: %v, want refused", err)
	}
}
