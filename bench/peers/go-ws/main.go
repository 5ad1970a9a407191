// Go WebSocket peer: net/http with gorilla/websocket; /ws/echo echoes every text and binary
// message (compression negotiated when the client offers it). GOMAXPROCS is the caller's
// (the benchmark runs it pinned to one CPU with GOMAXPROCS=1). Usage: go-ws PORT
package main

import (
	"log"
	"net/http"
	"os"

	"github.com/gorilla/websocket"
)

var upgrader = websocket.Upgrader{
	ReadBufferSize:    4096,
	WriteBufferSize:   4096,
	EnableCompression: true,
	CheckOrigin:       func(*http.Request) bool { return true },
}

func echo(w http.ResponseWriter, r *http.Request) {
	c, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer c.Close()
	for {
		kind, msg, err := c.ReadMessage()
		if err != nil {
			return
		}
		if err := c.WriteMessage(kind, msg); err != nil {
			return
		}
	}
}

func main() {
	port := "8080"
	if len(os.Args) > 1 {
		port = os.Args[1]
	}
	http.HandleFunc("/ws/echo", echo)
	log.Fatal(http.ListenAndServe("127.0.0.1:"+port, nil))
}
