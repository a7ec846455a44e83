package config

import "strings"

// sendableSecret reports whether a token or key can travel as is in an HTTP header and be
// matched there: no white space at either end (callers' credentials are trimmed, and a
// provider trims or refuses) and no control character (Go refuses such a header value, and
// a newline in it would split the header). The empty string passes: it means "not set".
func sendableSecret(s string) bool {
	if strings.TrimSpace(s) != s {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return false
		}
	}
	return true
}

// shownURL is a base_url fit for an error message: redactURL's, its query and fragment
// replaced by "xxxxx" after their '?' or '#' (kept, so the message shows that it has one),
// since they may hold a key too (?key=... is how some providers take it).
func shownURL(raw string) string {
	s := redactURL(raw)
	if i := strings.IndexAny(s, "?#"); i >= 0 {
		s = s[:i+1] + "xxxxx"
	}
	return s
}

// redactURL is a URL fit for an error message: everything between its scheme's "://" (or
// its start) and its last '@' — the user info, which may hold the Redis password or an
// upstream's credentials — is replaced by "xxxxx". url.URL.Redacted is not enough: it keeps a
// user name (a token given as one) and leaves alone a URL it reads as opaque or relative
// ("default:pw@host:6379" without its scheme, "redis//:pw@host").
func redactURL(raw string) string {
	at := strings.LastIndex(raw, "@")
	if at < 0 {
		return raw
	}
	start := 0
	if i := strings.Index(raw[:at], "://"); i >= 0 {
		start = i + len("://")
	}
	return raw[:start] + "xxxxx" + raw[at:]
}
