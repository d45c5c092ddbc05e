// Package webhook sends signed webhook requests (Standard Webhooks) to addresses that pass a server-side request forgery guard.
package webhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
)

// ErrForbiddenAddress: the URL's host is, or resolves to, an address webhooks may not reach.
var ErrForbiddenAddress = errors.New("address not allowed for webhooks")

// blocked are the ranges a webhook may not reach beyond what netip's predicates name (loopback, private,
// link-local, multicast, unspecified): shared, benchmark, reserved and documentation space, and the 6to4/NAT64
// prefixes that embed an IPv4 address.
var blocked = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("2001:db8::/32"),
	netip.MustParsePrefix("2002::/16"),
	netip.MustParsePrefix("100::/64"),
}

// Guard decides which addresses webhooks may reach: public unicast addresses, and those in Allow (config
// webhooks.allow_cidrs, e.g. 127.0.0.0/8 for a receiver on this machine).
type Guard struct {
	Allow []netip.Prefix
	// Resolver resolves host names at check time (nil: net.DefaultResolver).
	Resolver *net.Resolver
}

// ParseCIDRs parses a list of CIDR prefixes (or single addresses).
func ParseCIDRs(list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if !strings.Contains(s, "/") {
			a, err := netip.ParseAddr(s)
			if err != nil {
				return nil, fmt.Errorf("%q: %w", s, err)
			}
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// Prefixes of IPv6 forms that carry an IPv4 address in their last 32 bits besides the IPv4-mapped ::ffff:a.b.c.d
// (which netip.Addr.Unmap handles): the deprecated IPv4-compatible ::a.b.c.d (RFC 4291 §2.5.5.1) and SIIT's
// IPv4-translated ::ffff:0:a.b.c.d (RFC 2765). A host may route either to the IPv4 address it embeds.
var (
	ipv4Compatible = netip.MustParsePrefix("::/96")
	ipv4Translated = netip.MustParsePrefix("::ffff:0:0:0/96")
)

// Normalize answers the address a webhook to addr may reach: the IPv4 address an IPv4-mapped, IPv4-compatible or
// IPv4-translated IPv6 address embeds, else addr itself. :: and ::1 stay themselves (unspecified and loopback).
func Normalize(addr netip.Addr) netip.Addr {
	addr = addr.Unmap()
	if !addr.Is6() || addr.Zone() != "" {
		return addr
	}
	if (ipv4Compatible.Contains(addr) && addr != netip.IPv6Unspecified() && addr != netip.IPv6Loopback()) ||
		ipv4Translated.Contains(addr) {
		b := addr.As16()
		return netip.AddrFrom4([4]byte(b[12:]))
	}
	return addr
}

// Allowed reports whether a webhook may reach addr, judged by the address it normalizes to (Normalize).
func (g *Guard) Allowed(addr netip.Addr) bool {
	addr = Normalize(addr)
	for _, p := range g.Allow {
		if p.Contains(addr) {
			return true
		}
	}
	if !addr.IsValid() || addr.IsLoopback() || addr.IsPrivate() || addr.IsLinkLocalUnicast() ||
		addr.IsLinkLocalMulticast() || addr.IsInterfaceLocalMulticast() || addr.IsMulticast() || addr.IsUnspecified() {
		return false
	}
	if addr.Is4() && addr == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return false
	}
	for _, p := range blocked {
		if p.Contains(addr) {
			return false
		}
	}
	return true
}

// CheckURL checks an endpoint URL when it is created or changed: http or https, a host, no user info, and every
// address the host resolves to allowed. The dialer checks again at every connection (DNS may change).
func (g *Guard) CheckURL(ctx context.Context, raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("not a URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return errors.New("the scheme must be http or https")
	}
	if u.User != nil {
		return errors.New("user info is not allowed in the URL; use a path or query token")
	}
	host := u.Hostname()
	if host == "" {
		return errors.New("the URL has no host")
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if !g.Allowed(a) {
			if n := Normalize(a); n != a {
				return fmt.Errorf("%w: %s (%s)", ErrForbiddenAddress, a, n)
			}
			return fmt.Errorf("%w: %s", ErrForbiddenAddress, a)
		}
		return nil
	}
	if strings.EqualFold(host, "localhost") || strings.HasSuffix(strings.ToLower(host), ".localhost") {
		if !g.Allowed(netip.MustParseAddr("127.0.0.1")) {
			return fmt.Errorf("%w: %s", ErrForbiddenAddress, host)
		}
	}
	r := g.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	addrs, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return fmt.Errorf("cannot resolve %s: %w", host, err)
	}
	for _, a := range addrs {
		if !g.Allowed(a) {
			return fmt.Errorf("%w: %s resolves to %s", ErrForbiddenAddress, host, Normalize(a))
		}
	}
	return nil
}

// control refuses a connection to an address the guard does not allow. It runs after name resolution, on the
// address actually dialled, so a name that resolves differently later (DNS rebinding) is refused too.
func (g *Guard) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s", ErrForbiddenAddress, address)
	}
	if !g.Allowed(ap.Addr()) {
		return fmt.Errorf("%w: %s", ErrForbiddenAddress, ap.Addr())
	}
	return nil
}

// Dialer returns a dialer that connects only to allowed addresses.
func (g *Guard) Dialer() *net.Dialer {
	return &net.Dialer{Timeout: dialTimeout, KeepAlive: keepAlive, Control: g.control}
}
