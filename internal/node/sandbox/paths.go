package sandbox

import "strings"

// under reports whether p is dir or inside it.
func under(p, dir string) bool {
	dir = strings.TrimSuffix(dir, "/")
	return p == dir || strings.HasPrefix(p, dir+"/")
}
