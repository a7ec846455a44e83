package proxy

import (
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/admin"
)

// TestREADMENamesEveryRoute holds README's route lists to the router: the table of § HTTP
// surface against the gateway's own routes, and the admin routes § Operating it lists
// ("GET|POST /admin/users", "POST /admin/users/{name}/disable|enable") against the admin
// API's. A route added, removed or given another method without README following fails here;
// so does a route README names that nothing serves.
func TestREADMENamesEveryRoute(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	s := &Server{metrics: NewMetrics(nil), admin: admin.New(nil, 1000, "", zap.NewNop())}
	served := map[string]bool{}
	err = chi.Walk(s.Handler().(chi.Routes), func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		// chi names a mounted router's routes with "/*" between the mount and the route.
		route = strings.ReplaceAll(route, "/*/", "/")
		// A model's id is the rest of the path ({id} in README: an "org/name" id holds a slash).
		if route == modelsPath+"/*" {
			route = modelsPath + "/{id}"
		}
		served[method+" "+route] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	documented := readmeSurfaceRoutes(t, readmeSection(t, readme, "\n## HTTP surface\n"))
	for r := range readmeAdminRoutes(t, readmeSection(t, readme, "\n## Operating it\n")) {
		documented[r] = true
	}
	if len(served) < 25 || len(documented) < 25 {
		t.Fatalf("%d routes served, %d in README: the router or README is no longer read as the test expects", len(served), len(documented))
	}
	for r := range served {
		if !documented[r] {
			t.Errorf("%s is served; README does not name it", r)
		}
	}
	for r := range documented {
		if !served[r] {
			t.Errorf("README names %s; nothing serves it", r)
		}
	}
}

// readmeSection is README from heading to the next "## " heading.
func readmeSection(t *testing.T, readme, heading string) string {
	t.Helper()
	start := strings.Index(readme, heading)
	if start < 0 {
		t.Fatalf("README has no %q", strings.TrimSpace(heading))
	}
	s := readme[start+len(heading):]
	if end := strings.Index(s, "\n## "); end >= 0 {
		s = s[:end]
	}
	return s
}

// readmeSurfaceRoutes reads the first cells of § HTTP surface's table: "METHOD path" items, a
// bare path taking the method before it in its cell. The /admin row stands for the admin
// API, listed in § Operating it.
func readmeSurfaceRoutes(t *testing.T, s string) map[string]bool {
	t.Helper()
	routes := map[string]bool{}
	item := regexp.MustCompile("`(?:([A-Z]+) )?(/[^` ]*)`")
	for _, line := range strings.Split(s, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cell := strings.SplitN(line, " | ", 2)[0]
		method := ""
		for _, m := range item.FindAllStringSubmatch(cell, -1) {
			if m[1] != "" {
				method = m[1]
			}
			if m[2] == "/admin/..." {
				continue
			}
			if method == "" {
				t.Fatalf("HTTP surface row %q names %s without a method", cell, m[2])
			}
			routes[method+" "+m[2]] = true
		}
	}
	return routes
}

// readmeAdminRoutes reads the admin routes § Operating it lists: "GET|POST /admin/users",
// "POST /admin/users/{name}/disable|enable", a query string left out.
func readmeAdminRoutes(t *testing.T, s string) map[string]bool {
	t.Helper()
	routes := map[string]bool{}
	item := regexp.MustCompile("`((?:GET|POST|PATCH|PUT|DELETE)(?:\\|(?:GET|POST|PATCH|PUT|DELETE))*) (/admin/[^`? ]*)")
	for _, m := range item.FindAllStringSubmatch(s, -1) {
		path := m[2]
		var paths []string
		if i := strings.LastIndex(path, "/"); strings.Contains(path[i:], "|") {
			for _, last := range strings.Split(path[i+1:], "|") {
				paths = append(paths, path[:i+1]+last)
			}
		} else {
			paths = []string{path}
		}
		for _, method := range strings.Split(m[1], "|") {
			for _, p := range paths {
				routes[method+" "+p] = true
			}
		}
	}
	if !routes["PATCH /admin/users/{name}"] {
		t.Fatalf("read no PATCH /admin/users/{name} from README's admin routes (%v): they are no longer read as the test expects", routes)
	}
	return routes
}
