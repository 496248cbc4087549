// Package version holds the edgesteer version stamped into the custom
// binaries at link time (see the Makefile's LDFLAGS).
package version

// Version is set with -ldflags "-X github.com/edgesteer/edgesteer/internal/version.Version=...".
var Version = "dev"
