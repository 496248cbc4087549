package loadsource

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFile(t *testing.T) {
	tests := []struct {
		content string
		want    float64
		wantErr string
	}{
		{"62\n", 62, ""},
		{" 49.5 % ", 49.5, ""},
		{"0", 0, ""},
		{"100%\n", 100, ""},
		{"abc", 0, "not a number"},
		{"", 0, "not a number"},
		{"130", 0, "load 130 out of range 0-100"},
		{"-1", 0, "out of range"},
		{"NaN", 0, "out of range"},
		{strings.Repeat("1", maxFileSize+1), 0, "longer than"},
	}
	dir := t.TempDir()
	for _, tt := range tests {
		t.Run(tt.content[:min(len(tt.content), 10)], func(t *testing.T) {
			path := filepath.Join(dir, "load")
			if err := os.WriteFile(path, []byte(tt.content), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := (&File{Path: path}).Read(context.Background())
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), path) {
					t.Fatalf("Read() = %v, %v; want error containing %q and %q", got, err, tt.wantErr, path)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Read() = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func TestFileMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "does-not-exist")
	_, err := (&File{Path: path}).Read(context.Background())
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Read() error = %v, want one naming %s", err, path)
	}
}

func FuzzParseLoad(f *testing.F) {
	for _, s := range []string{"62\n", " 49.5 % ", "abc", "130", "1e2", "NaN", "-0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := parseLoad(s)
		if err == nil && !(v >= 0 && v <= 100) {
			t.Fatalf("parseLoad(%q) = %v without error", s, v)
		}
	})
}
