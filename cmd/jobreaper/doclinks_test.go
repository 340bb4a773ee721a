package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// docPages returns README.md and every page of docs/, relative to the
// repository's root, README first.
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(repoRoot(t), "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) == 0 {
		t.Fatal("docs/ holds no page")
	}
	out := []string{"README.md"}
	for _, p := range pages {
		out = append(out, filepath.ToSlash(filepath.Join("docs", filepath.Base(p))))
	}
	return out
}

// readDoc returns the text of the repository file rel ("docs/worker.md").
func readDoc(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// fence opens or closes a fenced code block: three or more backticks or
// tildes at the start of a line, indented by up to three spaces (a list
// item's block is indented more, and is a code block all the same).
var fence = regexp.MustCompile("^\\s*(```+|~~~+)")

// withoutCode returns text with the content of fenced code blocks and of
// inline code spans replaced by spaces (newlines kept), so that neither a
// heading nor a link is read from code. The backticks of a span are kept,
// so a link whose text is code (" [`deploy/`](deploy/) ") keeps its shape.
func withoutCode(text string) string {
	lines := strings.Split(text, "\n")
	open := ""
	for i, line := range lines {
		if m := fence.FindStringSubmatch(line); m != nil {
			switch {
			case open == "":
				open = m[1][:3]
				lines[i] = ""
				continue
			case strings.HasPrefix(m[1], open):
				open = ""
				lines[i] = ""
				continue
			}
		}
		if open != "" {
			lines[i] = ""
		}
	}
	b := []byte(strings.Join(lines, "\n"))
	for i := 0; i < len(b); {
		if b[i] != '`' {
			i++
			continue
		}
		n := 0
		for i+n < len(b) && b[i+n] == '`' {
			n++
		}
		ticks := strings.Repeat("`", n)
		end := strings.Index(string(b[i+n:]), ticks)
		if end < 0 {
			i += n
			continue
		}
		for j := i + n; j < i+n+end; j++ {
			if b[j] != '\n' {
				b[j] = ' '
			}
		}
		i += 2*n + end
	}
	return string(b)
}

// headingLine is an ATX heading: one to six '#', a space, its text.
var headingLine = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)

// inlineLink is a Markdown inline link or image: its text, then its target
// (and an optional title). The text may span lines.
var inlineLink = regexp.MustCompile(`!?\[([^\]]*)\]\(\s*([^)\s]*)(?:\s+"[^"]*")?\s*\)`)

// markdownAnchors returns the anchor of every heading of a Markdown text as
// GitHub makes it: the heading's text as rendered (links reduced to their
// text, code without its backticks), lower-cased, every character that is
// not a letter, a digit, a space, '-' or '_' dropped, and each space made
// a '-'; a heading whose anchor was already taken gets "-1", then "-2", ...
func markdownAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	lines := strings.Split(text, "\n")
	open := ""
	for _, line := range lines {
		if m := fence.FindStringSubmatch(line); m != nil {
			if open == "" {
				open = m[1][:3]
				continue
			} else if strings.HasPrefix(m[1], open) {
				open = ""
				continue
			}
		}
		if open != "" {
			continue
		}
		m := headingLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		slug := githubSlug(m[2])
		anchor := slug
		if n, dup := seen[slug]; dup {
			anchor = slug + "-" + strconv.Itoa(n)
		}
		seen[slug]++
		anchors[anchor] = true
	}
	return anchors
}

// githubSlug is the anchor GitHub gives a heading whose Markdown text is
// title (without duplicate numbering).
func githubSlug(title string) string {
	title = inlineLink.ReplaceAllString(title, "$1")
	title = strings.ReplaceAll(title, "`", "")
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// urlScheme starts a link that leaves the repository (https:, mailto:).
var urlScheme = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)

// docLink is one relative link of a page.
type docLink struct {
	// line is the link's line on its page, from 1.
	line int
	// target is the link as written ("schema.md#tables").
	target string
}

// relativeLinks returns every link of a Markdown text outside code that
// names no scheme (http:, mailto:, ...): the links into the repository.
func relativeLinks(text string) []docLink {
	plain := withoutCode(text)
	var out []docLink
	for _, m := range inlineLink.FindAllStringSubmatchIndex(plain, -1) {
		target := plain[m[4]:m[5]]
		if urlScheme.MatchString(target) {
			continue
		}
		out = append(out, docLink{line: 1 + strings.Count(plain[:m[0]], "\n"), target: target})
	}
	return out
}

// Every relative link of README.md and of docs/*.md names a file or
// directory of the repository, and every #anchor a heading of the page it
// names (GitHub's anchors), so that moving or renaming a section cannot
// leave a reader at a dead link. And README links every page of docs/,
// the manual's only index.
func TestDocsLinksAndAnchorsResolve(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	pages := docPages(t)
	anchorsOf := map[string]map[string]bool{}
	anchors := func(rel string) map[string]bool {
		if a, ok := anchorsOf[rel]; ok {
			return a
		}
		a := markdownAnchors(readDoc(t, rel))
		anchorsOf[rel] = a
		return a
	}
	linked := map[string]bool{}
	checked := 0
	for _, page := range pages {
		for _, l := range relativeLinks(readDoc(t, page)) {
			checked++
			where := page + ":" + strconv.Itoa(l.line)
			path, fragment, _ := strings.Cut(l.target, "#")
			rel := page
			if path != "" {
				rel = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(page), filepath.FromSlash(path))))
				if rel == ".." || strings.HasPrefix(rel, "../") {
					t.Errorf("%s: link %q leaves the repository", where, l.target)
					continue
				}
				if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(rel))); err != nil {
					t.Errorf("%s: link %q names %s, which does not exist", where, l.target, rel)
					continue
				}
			}
			if page == "README.md" {
				linked[rel] = true
			}
			if fragment == "" {
				continue
			}
			if !strings.HasSuffix(rel, ".md") {
				t.Errorf("%s: link %q has an anchor into %s, which is not a Markdown page", where, l.target, rel)
				continue
			}
			if !anchors(rel)[fragment] {
				t.Errorf("%s: link %q: %s has no heading whose anchor is #%s", where, l.target, rel, fragment)
			}
		}
	}
	if checked == 0 {
		t.Fatal("found no relative link to check")
	}
	for _, page := range pages[1:] {
		if !linked[page] {
			t.Errorf("README.md does not link %s: every page of docs/ is listed there", page)
		}
	}
}

// The anchor rules above are GitHub's: checked on headings of these pages'
// kinds, so that the link test cannot pass by agreeing with itself.
func TestDocsAnchorsFollowGitHubRules(t *testing.T) {
	t.Parallel()
	text := strings.Join([]string{
		"# Schema contract",
		"## A job ID's lives",
		"## What a handler's result does",
		"## Enqueueing, and other worker calls",
		"## asynq facts that shape this (asynq v0.26.0)",
		"### Run Redis with `maxmemory-policy noeviction`",
		"## The [daemon](operating.md)'s metrics",
		"## Alerts",
		"```sh",
		"# Alerts (a comment in a code block, not a heading)",
		"```",
		"## Alerts",
		"### Alerts",
		"#### max_lost_per_pass",
	}, "\n")
	got := markdownAnchors(text)
	want := []string{"schema-contract", "a-job-ids-lives", "what-a-handlers-result-does",
		"enqueueing-and-other-worker-calls", "asynq-facts-that-shape-this-asynq-v0260",
		"run-redis-with-maxmemory-policy-noeviction", "the-daemons-metrics",
		"alerts", "alerts-1", "alerts-2", "max_lost_per_pass"}
	var keys []string
	for k := range got {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Fatalf("anchors\n%v\nwant\n%v", keys, want)
	}
	links := relativeLinks("See [`deploy/`](deploy/) and [A job ID's\nlives](schema.md#a-job-ids-lives), " +
		"not `[code](x.md)` nor [the web](https://example.com).\n```\n[in a block](y.md)\n```\n")
	if len(links) != 2 || links[0].target != "deploy/" || links[1].target != "schema.md#a-job-ids-lives" || links[1].line != 1 {
		t.Fatalf("links %+v, want deploy/ and schema.md#a-job-ids-lives on line 1", links)
	}
}
