// An HTTP/3 load client on quic-go's http3 package: an independent client for bench/h3.py
// (the other one is canter's own `canter load --h3`, on quinn).
//
//	quic-go-load -n 100000 -c 1 -m 100 https://127.0.0.1:PORT/plaintext
//
// -c QUIC connections (an http3.Transport each), -m concurrent requests on each; -n requests
// in all. Prints one JSON object: rps, the 200 answers, latency percentiles (µs), errors.
package main

import (
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

func main() {
	n := flag.Int("n", 10000, "requests in all")
	conns := flag.Int("c", 1, "QUIC connections")
	streams := flag.Int("m", 1, "concurrent requests per connection")
	timeout := flag.Duration("timeout", 20*time.Second, "timeout of one request")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: quic-go-load [-n N] [-c C] [-m M] URL")
		os.Exit(2)
	}
	url := flag.Arg(0)
	var next, ok, failed atomic.Int64
	lat := make([][]time.Duration, *conns**streams)
	var wg sync.WaitGroup
	start := time.Now()
	for c := 0; c < *conns; c++ {
		tr := &http3.Transport{
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h3"}},
			QUICConfig:      &quic.Config{MaxIncomingStreams: 1000},
		}
		client := &http.Client{Transport: tr, Timeout: *timeout}
		for s := 0; s < *streams; s++ {
			wg.Add(1)
			go func(slot int) {
				defer wg.Done()
				for next.Add(1) <= int64(*n) {
					t0 := time.Now()
					resp, err := client.Get(url)
					if err != nil {
						failed.Add(1)
						continue
					}
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err != nil || resp.StatusCode != 200 {
						failed.Add(1)
						continue
					}
					ok.Add(1)
					lat[slot] = append(lat[slot], time.Since(t0))
				}
			}(c**streams + s)
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[int(p*float64(len(all)-1))].Microseconds())
	}
	out := map[string]any{
		"rps":       float64(ok.Load()) / elapsed.Seconds(),
		"succeeded": ok.Load(),
		"failed":    failed.Load(),
		"p50_us":    pct(0.50),
		"p99_us":    pct(0.99),
	}
	json.NewEncoder(os.Stdout).Encode(out)
}
