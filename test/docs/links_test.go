// Package docs_test checks the documentation: every relative link in README.md and docs/*.md
// leads to a file or directory of the repository and, where it names an anchor in a Markdown
// file, to a heading of that file. It needs no server and runs in well under a second.
package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/dynwatch/dynwatch/test/runner"
)

// pages lists README.md and every docs/*.md, relative to root.
func pages(t *testing.T, root string) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("docs/ holds no .md file")
	}
	out := []string{"README.md"}
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, filepath.ToSlash(rel))
	}
	return out
}

var (
	// inlineLink matches [text](target) and [text](target "title"); the text may hold one
	// level of brackets ([`resources[]`](...)).
	inlineLink = regexp.MustCompile(`\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	codeSpan   = regexp.MustCompile("`+[^`]*`+")
	heading    = regexp.MustCompile(`^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$`)
)

// link is one link as written, with the line it is on.
type link struct {
	target string
	line   int
}

// prose returns the lines of a Markdown text with fenced code blocks blanked, so that neither
// their links nor their headings count.
func prose(text string) []string {
	lines := strings.Split(text, "\n")
	fence := ""
	for i, l := range lines {
		trimmed := strings.TrimLeft(l, " ")
		switch {
		case fence == "" && (strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~")):
			fence = trimmed[:3]
			lines[i] = ""
		case fence != "":
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			lines[i] = ""
		}
	}
	return lines
}

// links returns the inline links of a Markdown text, outside code.
func links(text string) []link {
	var out []link
	for i, l := range prose(text) {
		l = codeSpan.ReplaceAllString(l, "")
		for _, m := range inlineLink.FindAllStringSubmatch(l, -1) {
			out = append(out, link{target: m[1], line: i + 1})
		}
	}
	return out
}

// slug turns a heading into its anchor as GitHub does: lower-case, spaces to '-', every other
// character but letters, digits, '-' and '_' dropped.
func slug(text string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// linkText reduces the links in a heading to their text, as GitHub's anchors do.
var linkText = regexp.MustCompile(`\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)`)

// anchors returns the anchors the headings of a Markdown text produce, with GitHub's -1, -2
// suffixes for repeated ones.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range prose(text) {
		m := heading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		s := slug(linkText.ReplaceAllString(m[1], "$1"))
		if n := seen[s]; n > 0 {
			out[s+"-"+strconv.Itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// external reports whether a target leaves the repository.
func external(target string) bool {
	lower := strings.ToLower(target)
	for _, p := range []string{"http://", "https://", "mailto:"} {
		if strings.HasPrefix(lower, p) {
			return true
		}
	}
	return false
}

// check returns what is wrong with one link on page (relative to root), or "".
func check(root, page string, l link) string {
	if l.target == "" {
		return "the link is empty"
	}
	if external(l.target) {
		return ""
	}
	path, anchor, _ := strings.Cut(l.target, "#")
	file := filepath.Join(root, filepath.FromSlash(page))
	if path != "" {
		if strings.HasPrefix(path, "/") {
			return "the link is absolute; write it relative to " + page
		}
		file = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
		rel, err := filepath.Rel(root, file)
		if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return "the link leaves the repository"
		}
		if _, err := os.Stat(file); err != nil {
			return "no such file or directory: " + filepath.ToSlash(rel)
		}
	}
	if anchor == "" || !strings.HasSuffix(file, ".md") {
		return ""
	}
	text, err := os.ReadFile(file)
	if err != nil {
		return err.Error()
	}
	if !anchors(string(text))[anchor] {
		return "no heading in " + filepath.Base(file) + " makes the anchor #" + anchor
	}
	return ""
}

func TestEveryRelativeLinkInTheDocsLeadsSomewhere(t *testing.T) {
	root := runner.Root(t)
	for _, page := range pages(t, root) {
		t.Run(page, func(t *testing.T) {
			text, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(page)))
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range links(string(text)) {
				if problem := check(root, page, l); problem != "" {
					t.Errorf("%s:%d: (%s): %s", page, l.line, l.target, problem)
				}
			}
		})
	}
}

// TestTheLinkCheckerFindsWhatItLooksFor checks the parts the test above relies on, so that it
// cannot pass by finding nothing.
func TestTheLinkCheckerFindsWhatItLooksFor(t *testing.T) {
	text := strings.Join([]string{
		"# Title",
		"## `resources[].transform`",
		"## Delivery guarantees and state",
		"## Delivery guarantees and state",
		"### The [chart's](x.md) RBAC",
		"See [a](a.md), [b](docs/b.md#x \"title\") and [`c[]`](#c); [web](https://example.com).",
		"`[not](a link)`",
		"```",
		"[not](a link either)",
		"# Not a heading",
		"```",
	}, "\n")
	var got []string
	for _, l := range links(text) {
		got = append(got, l.target)
	}
	if want := "x.md a.md docs/b.md#x #c https://example.com"; strings.Join(got, " ") != want {
		t.Errorf("links: got %q, want %q", strings.Join(got, " "), want)
	}
	a := anchors(text)
	for _, want := range []string{"title", "resourcestransform", "delivery-guarantees-and-state", "delivery-guarantees-and-state-1", "the-charts-rbac"} {
		if !a[want] {
			t.Errorf("anchors: %q missing from %v", want, a)
		}
	}
	if a["not-a-heading"] {
		t.Error("anchors: a line inside a code block counted as a heading")
	}
}
