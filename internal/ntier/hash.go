package ntier

import (
	"math/bits"
	"net/netip"
)

// jhash is the Linux kernel's jhash() (include/linux/jhash.h) over bytes,
// the function nftables' `jhash` expression applies to the source address
// (4 bytes for IPv4, 16 for IPv6), words read little-endian as on the
// machines this runs on.
func jhash(key []byte, initval uint32) uint32 {
	a := 0xdeadbeef + uint32(len(key)) + initval
	if len(key) == 0 {
		return a
	}
	word := func(k []byte, i int) uint32 {
		return uint32(k[i]) | uint32(k[i+1])<<8 | uint32(k[i+2])<<16 | uint32(k[i+3])<<24
	}
	v := [3]uint32{a, a, a}
	// All but the last block of 12 bytes: add and __jhash_mix (a c b a c b).
	for ; len(key) > 12; key = key[12:] {
		for i := range v {
			v[i] += word(key, 4*i)
		}
		t := 0
		for _, r := range [...]int{4, 6, 8, 16, 19, 4} {
			src, next := (t+2)%3, (t+1)%3 // a from c, b from a, c from b
			v[t] -= v[src]
			v[t] ^= bits.RotateLeft32(v[src], r)
			v[src] += v[next]
			t = next
		}
	}
	var k [12]byte
	copy(k[:], key)
	for i := range v {
		v[i] += word(k[:], 4*i)
	}
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
// reciprocal_scale of the hash, not a remainder), or `jhash ip6 saddr`
// for an IPv6 address. An invalid address gives -1.
func Bucket(a netip.Addr, seed uint32, buckets int) int {
	a = a.Unmap()
	if !a.IsValid() || buckets <= 0 {
		return -1
	}
	return int(uint64(jhash(a.AsSlice(), seed)) * uint64(buckets) >> 32)
}
