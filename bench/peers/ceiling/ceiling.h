/*
 * What the two ceiling responders (ceiling.c on epoll, ceiling_uring.c on io_uring)
 * share: the canned response with its once-a-second Date, the listening socket, the
 * "\r\n\r\n" counter and the growth of the fd-indexed connection table. Header-only;
 * each responder is one translation unit.
 */
#ifndef CEILING_H
#define CEILING_H

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>

/* Grows a table indexed by file descriptor, zero-filling the new slots, so that `fd`
 * fits; returns the (possibly moved) table and updates *len. Exits if out of memory. */
static void *fd_table_fit(void *table, int *len, int fd, size_t elem) {
    if (fd < *len) return table;
    int n = *len ? *len : 1024;
    while (n <= fd) n *= 2;
    char *t = realloc(table, (size_t)n * elem);
    if (!t) { perror("realloc"); exit(1); }
    memset(t + (size_t)*len * elem, 0, (size_t)(n - *len) * elem);
    *len = n;
    return t;
}

static char resp[512];
static size_t resp_len;
static char *date_pos;           /* where the 29-byte date lives inside resp */
static time_t last_date;

static void update_date(void) {
    time_t now = time(NULL);
    if (now == last_date) return;
    last_date = now;
    struct tm tm;
    gmtime_r(&now, &tm);
    char d[64];
    strftime(d, sizeof d, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    memcpy(date_pos, d, 29);
}

/* Parses `PORT [json]`, builds the canned response, ignores SIGPIPE, raises the open
 * files limit and returns a listening socket (created with `sock_flags`) on
 * 127.0.0.1:PORT (env CEILING_ADDR overrides the address). Exits on error. */
static int ceiling_start(int argc, char **argv, int sock_flags, const char *name) {
    if (argc < 2) { fprintf(stderr, "usage: %s PORT [json]\n", argv[0]); exit(2); }
    int port = atoi(argv[1]);
    int json = argc > 2 && strcmp(argv[2], "json") == 0;
    const char *body = json ? "{\"message\":\"Hello, World!\"}" : "Hello, World!";
    const char *ctype = json ? "application/json" : "text/plain";
    const char *DATE0 = "Thu, 01 Jan 1970 00:00:00 GMT";
    resp_len = (size_t)snprintf(resp, sizeof resp,
        "HTTP/1.1 200 OK\r\nServer: ceiling\r\nDate: %s\r\nContent-Type: %s\r\n"
        "Content-Length: %zu\r\n\r\n%s", DATE0, ctype, strlen(body), body);
    date_pos = strstr(resp, DATE0);
    update_date();

    signal(SIGPIPE, SIG_IGN);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | sock_flags, 0);
    if (ls < 0) { perror("socket"); exit(1); }
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    const char *addr = getenv("CEILING_ADDR");
    inet_pton(AF_INET, addr ? addr : "127.0.0.1", &sa.sin_addr);
    if (bind(ls, (struct sockaddr *)&sa, sizeof sa) < 0) { perror("bind"); exit(1); }
    if (listen(ls, 65535) < 0) { perror("listen"); exit(1); }
    fprintf(stderr, "%s listening on %s:%d (%s)\n", name, addr ? addr : "127.0.0.1", port,
            json ? "json" : "plaintext");
    return ls;
}

/* Counts the "\r\n\r\n" in buf[0..n), carrying the partial match (0..3) in *state. */
static size_t count_heads(int *state, const char *buf, size_t n) {
    size_t count = 0;
    int st = *state;
    for (size_t k = 0; k < n; k++) {
        char ch = buf[k];
        if (ch == '\r') st = (st == 2) ? 3 : 1;
        else if (ch == '\n' && (st == 1 || st == 3)) {
            if (st == 3) { count++; st = 0; } else st = 2;
        } else st = 0;
    }
    *state = st;
    return count;
}

#endif
