package config

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// config starts no goroutine; this holds it to that as it grows.
	goleak.VerifyTestMain(m)
}
