package ntier

import (
	"math/bits"
	"net/netip"
)

// jhash is the Linux kernel's jhash() (include/linux/jhash.h) over bytes,
// the function nftables' `jhash` expression applies to the source address.
// Only keys of up to 12 bytes are needed here (an IPv4 address).
func jhash(key []byte, initval uint32) uint32 {
	a := 0xdeadbeef + uint32(len(key)) + initval
	b, c := a, a
	var k [12]byte
	copy(k[:], key)
	word := func(i int) uint32 {
		return uint32(k[i]) | uint32(k[i+1])<<8 | uint32(k[i+2])<<16 | uint32(k[i+3])<<24
	}
	if len(key) == 0 {
		return c
	}
	v := [3]uint32{a + word(0), b + word(4), c + word(8)}
	// __jhash_final: c ^= b; c -= rol32(b, 14); a ^= c; a -= rol32(c, 11);
	// b ^= a; … each step mixes the word before into the next, c a b c a b c.
	t := 2
	for _, r := range [...]int{14, 11, 25, 16, 4, 14, 24} {
		src := (t + 2) % 3
		v[t] ^= v[src]
		v[t] -= bits.RotateLeft32(v[src], r)
		t = (t + 1) % 3
	}
	return v[2]
}

// Bucket returns the hash bucket of client address a as the kernel's
// `jhash ip saddr mod buckets seed seed` computes it (nft_jhash_eval:
// reciprocal_scale of the hash, not a remainder). Only IPv4 addresses
// are hashed; any other address gives -1.
func Bucket(a netip.Addr, seed uint32, buckets int) int {
	a = a.Unmap()
	if !a.Is4() || buckets <= 0 {
		return -1
	}
	b := a.As4()
	return int(uint64(jhash(b[:], seed)) * uint64(buckets) >> 32)
}
