package holds

import (
	"testing"

	"github.com/tollgate/tollgate/config"
)

// TestOpenReadTimeoutIsTheConfigsDefault: the configuration checks limits.settle_timeout
// against the read timeout Open sets when the DSN sets none (a settlement's last script is
// waited for up to it past its deadline); config cannot import this package to read it.
func TestOpenReadTimeoutIsTheConfigsDefault(t *testing.T) {
	if defaultReadTimeout != config.DefaultDBReadTimeout {
		t.Fatalf("Open's read timeout %v, config.DefaultDBReadTimeout %v: the settle_timeout check counts the wrong wait",
			defaultReadTimeout, config.DefaultDBReadTimeout)
	}
}
