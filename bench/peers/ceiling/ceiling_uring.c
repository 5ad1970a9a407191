/*
 * ceiling-uring: the ceiling responder (ceiling.c) on io_uring instead of epoll.
 * Single thread, parses nothing: every "\r\n\r\n" seen in the input is answered
 * with one canned response; all terminators of one receive are answered with one
 * send. Each connection always has exactly one operation in flight (a receive, or
 * the send of its answers), and one io_uring_enter both submits the new
 * operations and waits for completions, so system calls are shared by all the
 * connections that were ready at once (DEFER_TASKRUN: completions are processed
 * only when the loop asks for them).
 *
 * It shows what batching system calls across connections would give on this
 * machine; it is a measuring tool, not a server (no output backlog: a send that
 * the kernel takes in part is finished before the connection receives again).
 *
 *   gcc -O2 -o ceiling-uring ceiling_uring.c -luring
 *   ./ceiling-uring PORT [json]
 */
#include "ceiling.h"

#include <arpa/inet.h>
#include <errno.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RDBUF 16384
#define ENTRIES 4096

enum { OP_ACCEPT = 0, OP_RECV = 1, OP_SEND = 2 };

struct conn {
    int state;              /* bytes of "\r\n\r\n" matched so far */
    char *in;               /* receive buffer */
    char *out;              /* answers being sent */
    size_t out_len, out_off, out_cap;
};

static struct conn **conns;
static int nconns;
static struct io_uring ring;
static struct io_uring_sqe *sqe(void) {
    struct io_uring_sqe *s = io_uring_get_sqe(&ring);
    if (!s) {
        io_uring_submit(&ring);
        s = io_uring_get_sqe(&ring);
    }
    if (!s) { fprintf(stderr, "no sqe\n"); exit(1); }
    return s;
}

static void set_data(struct io_uring_sqe *s, int fd, int op) {
    io_uring_sqe_set_data64(s, ((uint64_t)(uint32_t)fd << 8) | (uint64_t)op);
}

static void post_recv(int fd, struct conn *c) {
    struct io_uring_sqe *s = sqe();
    io_uring_prep_recv(s, fd, c->in, RDBUF, 0);
    set_data(s, fd, OP_RECV);
}

static void post_send(int fd, struct conn *c) {
    struct io_uring_sqe *s = sqe();
    io_uring_prep_send(s, fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
    set_data(s, fd, OP_SEND);
}

static void post_accept(int ls) {
    struct io_uring_sqe *s = sqe();
    io_uring_prep_multishot_accept(s, ls, NULL, NULL, 0);
    set_data(s, ls, OP_ACCEPT);
}

static struct conn *new_conn(int fd) {
    conns = fd_table_fit(conns, &nconns, fd, sizeof *conns);
    struct conn *c = calloc(1, sizeof *c);
    if (!c || !(c->in = malloc(RDBUF))) { perror("malloc"); exit(1); }
    conns[fd] = c;
    return c;
}

static void close_conn(int fd) {
    struct conn *c = conns[fd];
    close(fd);
    if (c) { free(c->in); free(c->out); free(c); }
    conns[fd] = NULL;
}

static void on_recv(int fd, struct conn *c, int r) {
    if (r <= 0) { close_conn(fd); return; }
    size_t count = count_heads(&c->state, c->in, (size_t)r);
    if (!count) { post_recv(fd, c); return; }
    size_t need = count * resp_len;
    if (need > c->out_cap) {
        c->out_cap = need * 2;
        c->out = realloc(c->out, c->out_cap);
        if (!c->out) { perror("realloc"); exit(1); }
    }
    for (size_t i = 0; i < count; i++) memcpy(c->out + i * resp_len, resp, resp_len);
    c->out_len = need;
    c->out_off = 0;
    post_send(fd, c);
}

static void on_send(int fd, struct conn *c, int r) {
    if (r < 0) { close_conn(fd); return; }
    c->out_off += (size_t)r;
    if (c->out_off < c->out_len) post_send(fd, c);
    else post_recv(fd, c);
}

int main(int argc, char **argv) {
    int ls = ceiling_start(argc, argv, 0, "ceiling-uring");
    int one = 1;

    struct io_uring_params p = { 0 };
    p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_CQSIZE;
    p.cq_entries = ENTRIES * 4;
    int e = io_uring_queue_init_params(ENTRIES, &ring, &p);
    if (e < 0) { fprintf(stderr, "io_uring_queue_init: %s\n", strerror(-e)); return 1; }
    post_accept(ls);
    for (;;) {
        int w = io_uring_submit_and_wait(&ring, 1);
        if (w < 0 && w != -EINTR && w != -EAGAIN && w != -EBUSY) {
            fprintf(stderr, "io_uring_submit_and_wait: %s\n", strerror(-w));
            return 1;
        }
        update_date();
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&ring, head, cqe) {
            seen++;
            uint64_t d = io_uring_cqe_get_data64(cqe);
            int fd = (int)(d >> 8), op = (int)(d & 0xff), res = cqe->res;
            if (op == OP_ACCEPT) {
                if (res >= 0) {
                    setsockopt(res, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    post_recv(res, new_conn(res));
                }
                if (!(cqe->flags & IORING_CQE_F_MORE)) post_accept(ls);
                continue;
            }
            struct conn *c = fd < nconns ? conns[fd] : NULL;
            if (!c) continue;
            if (op == OP_RECV) on_recv(fd, c, res);
            else on_send(fd, c, res);
        }
        io_uring_cq_advance(&ring, seen);
    }
}
