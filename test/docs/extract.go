// Package docs runs the commands of the user documentation (README.md and
// docs/*.md) against a real dev deployment, so that what a new user copies
// and pastes keeps working.
//
// A shell example is a line, or several joined by a trailing backslash, an
// open quote or an open brace, of a ```sh fence. Output samples live in
// ```text fences and are never run. Conventions the runner understands:
//
//   - A trailing comment "# exit N" declares the exit code the command must
//     end with (default 0).
//   - Upper-case placeholders ending in _ID (WORKSPACE_ID, EGRESS_ID, …),
//     example IDs such as ws-0123456789abcdefghij and abbreviations such as
//     "eg-…" are replaced by the last ID of that kind the earlier commands
//     printed.
package docs

import (
	"bufio"
	"strings"
)

// Command is one shell command of a document.
type Command struct {
	// Text is the command as written, continuation lines joined with
	// newlines.
	Text string
	// Line is the line of the document where it starts.
	Line int
	// Fence is the index of the fence it belongs to, counted from zero.
	Fence int
}

// Extract returns the commands of the ```sh (or ```bash, ```shell) fences of
// a Markdown document, in order.
func Extract(doc string) []Command {
	var (
		out     []Command
		inFence bool
		runs    bool
		fence   = -1
		pending strings.Builder
		start   int
	)
	sc := bufio.NewScanner(strings.NewReader(doc))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") {
			if !inFence {
				inFence = true
				fence++
				info := strings.Fields(strings.TrimPrefix(trimmed, "```"))
				runs = len(info) > 0 && (info[0] == "sh" || info[0] == "bash" || info[0] == "shell")
			} else {
				inFence = false
				if pending.Len() > 0 {
					out = append(out, Command{Text: pending.String(), Line: start, Fence: fence})
					pending.Reset()
				}
			}
			continue
		}
		if !inFence || !runs {
			continue
		}
		if pending.Len() == 0 {
			if trimmed == "" || strings.HasPrefix(trimmed, "#") {
				continue
			}
			start = n
		} else {
			pending.WriteByte('\n')
		}
		pending.WriteString(line)
		if complete(pending.String()) {
			out = append(out, Command{Text: pending.String(), Line: start, Fence: fence})
			pending.Reset()
		}
	}
	return out
}

// complete reports whether text is a whole shell command: no trailing
// backslash, no open quote, no open brace or parenthesis. It is a heuristic
// for documentation, not a shell parser.
func complete(text string) bool {
	if strings.HasSuffix(strings.TrimRight(text, " \t"), "\\") {
		return false
	}
	var single, double bool
	depth := 0
	for i := 0; i < len(text); i++ {
		c := text[i]
		switch {
		case single:
			if c == '\'' {
				single = false
			}
		case double:
			if c == '\\' {
				i++
			} else if c == '"' {
				double = false
			}
		case c == '\\':
			i++
		case c == '\'':
			single = true
		case c == '"':
			double = true
		case c == '#' && (i == 0 || text[i-1] == ' ' || text[i-1] == '\t'):
			// A comment runs to the end of its line.
			for i < len(text) && text[i] != '\n' {
				i++
			}
		case c == '{' || c == '(':
			depth++
		case c == '}' || c == ')':
			depth--
		}
	}
	return !single && !double && depth <= 0
}

// ExpectedExit returns the exit code a command declares with a trailing
// "# exit N" comment, and 0 without one.
func ExpectedExit(text string) int {
	last := text
	if i := strings.LastIndexByte(text, '\n'); i >= 0 {
		last = text[i+1:]
	}
	i := strings.LastIndex(last, "# exit ")
	if i < 0 {
		return 0
	}
	n := 0
	for _, c := range strings.TrimSpace(last[i+len("# exit "):]) {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// FirstWord returns the program a command runs: its first word.
func FirstWord(text string) string {
	f := strings.Fields(text)
	if len(f) == 0 {
		return ""
	}
	return f[0]
}
