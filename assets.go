// Package greendot holds the files embedded in the greendot binary: the
// demo page (web/) and the browser client it loads (clients/js/greendot.js).
package greendot

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed web clients/js/greendot.js
var assets embed.FS

// DemoHandler serves the demo page at / and the JavaScript client at
// /greendot.js.
func DemoHandler() http.Handler {
	web, err := fs.Sub(assets, "web")
	if err != nil {
		panic(err) // the embed pattern above guarantees the directory
	}
	files := http.FileServer(http.FS(web))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/greendot.js" {
			b, err := assets.ReadFile("clients/js/greendot.js")
			if err != nil {
				http.Error(w, "not found", http.StatusNotFound)
				return
			}
			w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
			w.Header().Set("Cache-Control", "no-cache")
			_, _ = w.Write(b)
			return
		}
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
