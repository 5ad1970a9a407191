// go-nethttp: Go net/http peer (HTTP/1.1 + h2c via golang.org/x/net/http2/h2c).
//
//	go build -o go-nethttp . && GOMAXPROCS=1 ./go-nethttp PORT [CERT.pem KEY.pem]
//
// With CERT and KEY it serves HTTPS (crypto/tls defaults: TLS 1.2 and 1.3, session tickets).
package main

import (
	"encoding/json"
	"log"
	"net/http"
	"os"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"
)

type message struct {
	Message string `json:"message"`
}

func main() {
	port := "8080"
	if len(os.Args) > 1 {
		port = os.Args[1]
	} else if p := os.Getenv("PORT"); p != "" {
		port = p
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/plaintext", func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h["Server"] = []string{"go-nethttp"}
		h["Content-Type"] = []string{"text/plain"}
		h["Content-Length"] = []string{"13"}
		w.Write([]byte("Hello, World!"))
	})
	mux.HandleFunc("/json", func(w http.ResponseWriter, r *http.Request) {
		body, err := json.Marshal(message{Message: "Hello, World!"})
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		h := w.Header()
		h["Server"] = []string{"go-nethttp"}
		h["Content-Type"] = []string{"application/json"}
		w.Write(body)
	})
	// net/http adds Date itself and Content-Length for small bodies.
	srv := &http.Server{
		Addr:    "127.0.0.1:" + port,
		Handler: h2c.NewHandler(mux, &http2.Server{}),
	}
	log.Printf("go-nethttp listening on %s", srv.Addr)
	if len(os.Args) > 3 {
		srv.Handler = mux
		log.Fatal(srv.ListenAndServeTLS(os.Args[2], os.Args[3]))
	}
	log.Fatal(srv.ListenAndServe())
}
