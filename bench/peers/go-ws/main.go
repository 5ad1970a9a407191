// Go WebSocket peer: net/http with gorilla/websocket; /ws/echo echoes every text and binary
// message (compression negotiated when the client offers it); /ws/broadcast is a room where
// every message goes to every member (each member's writer goroutine drains its own bounded
// queue; a member whose queue is full misses the message, as canter's hub skips it). GOMAXPROCS is the caller's
// (the benchmark runs it pinned to one CPU with GOMAXPROCS=1). Usage: go-ws PORT
package main

import (
	"log"
	"net/http"
	"os"
	"sync"

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

type room struct {
	mu      sync.Mutex
	members map[chan []byte]struct{}
}

var hub = room{members: map[chan []byte]struct{}{}}

func (r *room) publish(msg []byte) {
	r.mu.Lock()
	for ch := range r.members {
		select {
		case ch <- msg:
		default: // slow member: skipped
		}
	}
	r.mu.Unlock()
}

func broadcast(w http.ResponseWriter, r *http.Request) {
	c, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer c.Close()
	ch := make(chan []byte, 256)
	hub.mu.Lock()
	hub.members[ch] = struct{}{}
	hub.mu.Unlock()
	defer func() {
		hub.mu.Lock()
		delete(hub.members, ch)
		hub.mu.Unlock()
	}()
	done := make(chan struct{})
	go func() {
		for {
			select {
			case msg := <-ch:
				if err := c.WriteMessage(websocket.BinaryMessage, msg); err != nil {
					return
				}
			case <-done:
				return
			}
		}
	}()
	defer close(done)
	for {
		_, msg, err := c.ReadMessage()
		if err != nil {
			return
		}
		hub.publish(msg)
	}
}

func main() {
	port := "8080"
	if len(os.Args) > 1 {
		port = os.Args[1]
	}
	http.HandleFunc("/ws/echo", echo)
	http.HandleFunc("/ws/broadcast", broadcast)
	log.Fatal(http.ListenAndServe("127.0.0.1:"+port, nil))
}
