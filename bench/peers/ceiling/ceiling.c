/*
 * ceiling: the trivial HTTP/1.1 responder that shows what the kernel and the
 * load generator allow on this machine.  Single thread, epoll, parses nothing:
 * every "\r\n\r\n" seen in the input is answered with one canned response.
 * Pipelining: all terminators found in one read are answered with one write.
 *
 *   gcc -O2 -o ceiling ceiling.c
 *   ./ceiling PORT [json]      (json: canned body is {"message":"Hello, World!"})
 *
 * Listens on 127.0.0.1:PORT (env CEILING_ADDR overrides the address).
 */
#include "ceiling.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RDBUF 65536
#define MAXEV 512

struct conn {
    int state;        /* how many bytes of "\r\n\r\n" matched so far (0..3) */
    char *out;        /* pending output not yet accepted by the kernel */
    size_t out_len, out_cap;
    int want_out;     /* EPOLLOUT registered */
};

static struct conn *conns;
static int nconns;
static char *wbuf;               /* scratch buffer for one batch of responses */
static size_t wbuf_cap;
static struct conn *get_conn(int fd) {
    conns = fd_table_fit(conns, &nconns, fd, sizeof *conns);
    return &conns[fd];
}

static void close_conn(int ep, int fd) {
    struct conn *c = get_conn(fd);
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    free(c->out);
    memset(c, 0, sizeof *c);
}

static void set_out_interest(int ep, int fd, struct conn *c, int want) {
    if (c->want_out == want) return;
    struct epoll_event ev = { .events = EPOLLIN | (want ? EPOLLOUT : 0), .data.fd = fd };
    epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
    c->want_out = want;
}

/* append to the pending output of c */
static void queue_out(struct conn *c, const char *p, size_t n) {
    if (c->out_len + n > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 4096;
        while (cap < c->out_len + n) cap *= 2;
        c->out = realloc(c->out, cap);
        if (!c->out) { perror("realloc"); exit(1); }
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, p, n);
    c->out_len += n;
}

/* try to flush pending output; returns -1 on fatal error */
static int flush_out(int ep, int fd, struct conn *c) {
    while (c->out_len) {
        ssize_t w = write(fd, c->out, c->out_len);
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            if (errno == EINTR) continue;
            return -1;
        }
        memmove(c->out, c->out + w, c->out_len - (size_t)w);
        c->out_len -= (size_t)w;
    }
    set_out_interest(ep, fd, c, c->out_len != 0);
    return 0;
}

static void send_responses(int ep, int fd, struct conn *c, size_t count) {
    size_t need = count * resp_len;
    if (need > wbuf_cap) {
        wbuf_cap = need * 2;
        wbuf = realloc(wbuf, wbuf_cap);
        if (!wbuf) { perror("realloc"); exit(1); }
    }
    for (size_t i = 0; i < count; i++) memcpy(wbuf + i * resp_len, resp, resp_len);
    if (c->out_len) { /* already backed up: keep order */
        queue_out(c, wbuf, need);
        if (flush_out(ep, fd, c) < 0) close_conn(ep, fd);
        return;
    }
    size_t off = 0;
    while (off < need) {
        ssize_t w = write(fd, wbuf + off, need - off);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            close_conn(ep, fd);
            return;
        }
        off += (size_t)w;
    }
    if (off < need) {
        queue_out(c, wbuf + off, need - off);
        set_out_interest(ep, fd, c, 1);
    }
}

int main(int argc, char **argv) {
    int ls = ceiling_start(argc, argv, SOCK_NONBLOCK, "ceiling");
    int one = 1;

    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = { .events = EPOLLIN, .data.fd = ls };
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);

    static char rbuf[RDBUF];
    struct epoll_event evs[MAXEV];
    for (;;) {
        int n = epoll_wait(ep, evs, MAXEV, 1000);
        if (n < 0) { if (errno == EINTR) continue; perror("epoll_wait"); return 1; }
        update_date();
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == ls) {
                for (;;) {
                    int cfd = accept4(ls, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                    if (cfd < 0) break;
                    setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    struct conn *c = get_conn(cfd);
                    memset(c, 0, sizeof *c);
                    struct epoll_event cev = { .events = EPOLLIN, .data.fd = cfd };
                    epoll_ctl(ep, EPOLL_CTL_ADD, cfd, &cev);
                }
                continue;
            }
            struct conn *c = get_conn(fd);
            if (evs[i].events & EPOLLOUT) {
                if (flush_out(ep, fd, c) < 0) { close_conn(ep, fd); continue; }
            }
            if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                ssize_t r = read(fd, rbuf, sizeof rbuf);
                if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                    close_conn(ep, fd);
                    continue;
                }
                if (r < 0) continue;
                size_t count = count_heads(&c->state, rbuf, (size_t)r);
                if (count) send_responses(ep, fd, c, count);
            }
        }
    }
}
