package docs

import (
	"regexp"
	"strings"
)

// kinds maps the placeholder of each kind of object to its ID prefix.
var kinds = map[string]string{
	"WORKSPACE_ID":  "ws-",
	"EGRESS_ID":     "eg-",
	"RESOLVER_ID":   "rs-",
	"ENROLLMENT_ID": "en-",
	"VOLUME_ID":     "vol-",
}

var (
	// idRE matches an ID as the server prints it.
	idRE = regexp.MustCompile(`\b(ws|eg|rs|en|vol)-[a-z2-7]{20}\b`)
	// exampleRE matches the IDs documentation uses as examples: the
	// documented sample suffix, or an ellipsis.
	exampleRE = regexp.MustCompile(`\b(ws|eg|rs|en|vol)-(0123456789abcdefghij\b|…)`)
	// placeholderRE matches an upper-case placeholder.
	placeholderRE = regexp.MustCompile(`\b[A-Z]+_ID\b`)
)

// ids remembers the last ID of each kind that a command printed.
type ids map[string]string

// see records the IDs in output.
func (m ids) see(output string) {
	for _, id := range idRE.FindAllString(output, -1) {
		m[id[:strings.IndexByte(id, '-')+1]] = id
	}
}

// substitute replaces placeholders and example IDs with the last ID of
// their kind; one whose kind was never seen stays as it is.
func (m ids) substitute(text string) string {
	text = placeholderRE.ReplaceAllStringFunc(text, func(p string) string {
		if id, ok := m[kinds[p]]; ok {
			return id
		}
		return p
	})
	return exampleRE.ReplaceAllStringFunc(text, func(e string) string {
		if id, ok := m[e[:strings.IndexByte(e, '-')+1]]; ok {
			return id
		}
		return e
	})
}
