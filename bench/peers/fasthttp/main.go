// fasthttp: valyala/fasthttp peer (HTTP/1.1 only).
//
//	go build -o fasthttp-peer . && GOMAXPROCS=1 ./fasthttp-peer PORT
package main

import (
	"encoding/json"
	"log"
	"os"

	"github.com/valyala/fasthttp"
)

type message struct {
	Message string `json:"message"`
}

var hello = []byte("Hello, World!")

func handler(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case "/plaintext":
		ctx.SetContentType("text/plain")
		ctx.SetBody(hello)
	case "/json":
		body, err := json.Marshal(message{Message: "Hello, World!"})
		if err != nil {
			ctx.Error(err.Error(), 500)
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBody(body)
	default:
		ctx.Error("not found", fasthttp.StatusNotFound)
	}
}

func main() {
	port := "8080"
	if len(os.Args) > 1 {
		port = os.Args[1]
	} else if p := os.Getenv("PORT"); p != "" {
		port = p
	}
	// fasthttp sets Server, Date (cached per second) and Content-Length itself.
	s := &fasthttp.Server{
		Handler: handler,
		Name:    "fasthttp",
	}
	addr := "127.0.0.1:" + port
	log.Printf("fasthttp listening on %s", addr)
	log.Fatal(s.ListenAndServe(addr))
}
