module canter-bench/go-ws

go 1.26.8

require github.com/gorilla/websocket v1.5.3
