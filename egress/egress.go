// Package egress decides which addresses a sink declared by a tenant (a Subscription) may
// reach. A tenant, unlike the operator, is not trusted to choose targets: by default it may not
// reach loopback, link-local (cloud metadata included), private, shared, multicast or reserved
// addresses, nor those the operator names as in-cluster; the operator's allow-list lets some
// through. The decision is made on the address actually dialled (Policy.Control, a
// net.Dialer's Control), so a name that resolves to a refused address, now or after a DNS
// change, reaches nothing.
//
// A Policy is immutable once built and safe for concurrent use.
package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"
)

// Policy is the addresses refused and allowed. Deny (the operator's in-cluster ranges) wins
// over Allow, which wins over the default refused ranges.
type Policy struct {
	Allow, Deny []netip.Prefix
}

// refused are the ranges a tenant's sink may not reach unless allowed, each with its class.
var refused = []struct {
	prefix netip.Prefix
	class  string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified"},
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local (cloud metadata included)"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private"},
	{netip.MustParsePrefix("fc00::/7"), "private (unique local; cloud metadata included)"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared (carrier-grade NAT, often pods or cloud metadata)"},
	{netip.MustParsePrefix("192.0.0.0/24"), "reserved"},
	{netip.MustParsePrefix("198.18.0.0/15"), "reserved (benchmarking)"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
	{netip.MustParsePrefix("64:ff9b::/96"), "NAT64 (reaches IPv4 addresses)"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "NAT64 (reaches IPv4 addresses)"},
	{netip.MustParsePrefix("2002::/16"), "6to4 (reaches IPv4 addresses)"},
}

// Class names the refused range addr is in, or "" for a public address.
func Class(addr netip.Addr) string {
	addr = addr.Unmap().WithZone("") // a prefix contains no zoned address
	for _, r := range refused {
		if r.prefix.Contains(addr) {
			return r.class
		}
	}
	return ""
}

// ErrRefused is what Check's errors wrap.
var ErrRefused = errors.New("egress refused")

// Check reports whether addr may be reached: nil, or an error wrapping ErrRefused that names
// the address and why.
func (p *Policy) Check(addr netip.Addr) error {
	addr = addr.Unmap().WithZone("") // a prefix contains no zoned address
	for _, d := range p.Deny {
		if d.Contains(addr) {
			return fmt.Errorf("%w: %s is in %s, an in-cluster range (subscriptions.egress.deny)", ErrRefused, addr, d)
		}
	}
	for _, a := range p.Allow {
		if a.Contains(addr) {
			return nil
		}
	}
	if class := Class(addr); class != "" {
		return fmt.Errorf("%w: %s is a %s address, which a subscription may not reach unless subscriptions.egress.allow names it", ErrRefused, addr, class)
	}
	return nil
}

// Control is a net.Dialer's Control: it refuses a connection to an address Check refuses,
// before it is made. address is the resolved "ip:port" being dialled.
func (p *Policy) Control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: cannot tell the address of %q", ErrRefused, address)
	}
	return p.Check(ap.Addr())
}
