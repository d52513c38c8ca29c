//go:build !unix

package sqlite

import "time"

// cpuTime is not measured here.
func cpuTime() time.Duration { return 0 }
