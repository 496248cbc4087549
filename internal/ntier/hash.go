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
	a += word(0)
	b += word(4)
	c += word(8)
	// __jhash_final
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return c
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
