/* sluice._csyncer: fdatasync (and appends) in native threads that never hold the GIL.
 *
 * An fsync'd acknowledgement waits for a thread hop there and back.  Through a Python
 * worker thread each hop also waits for the GIL (the event loop holds it while it works),
 * which at the latencies of a tailing consumer costs as much as the fdatasync itself.
 * These threads run no Python: the event loop hands a file descriptor over and learns of
 * the result through an eventfd it polls.
 *
 *   Syncer(threads)      start ``threads`` sync threads (1..64)
 *   submit(fd, token)    queue an fdatasync of the file open as ``fd``; the fd is dup()ed at
 *                        once, so the caller may close its own meanwhile
 *   submit_write(fd, token, buffers, pos, sync)
 *                        queue a write of ``buffers`` (objects with the buffer protocol,
 *                        held until ``done`` reports the job) at ``pos`` of ``fd``, all of
 *                        them (short writes are resumed), then an fdatasync if ``sync``.  All
 *                        or nothing: on a failed write or fdatasync the file is cut back to
 *                        ``pos`` before the errno is reported.  A write that hangs (a frozen
 *                        file system) holds one thread, never the event loop
 *   fileno()             an eventfd, readable once a submitted sync has completed
 *   done()               the (token, errno) pairs completed since the last call (errno 0:
 *                        synced), in completion order; clears the eventfd.  Also after
 *                        close(), for the syncs it finished
 *   close()              finish the queued syncs and stop the threads (the eventfd is
 *                        closed with the object)
 *
 * Only the thread that owns the event loop calls these (the object is not otherwise
 * thread-safe for Python callers); the sync threads touch nothing but the queues below.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_THREADS 64
#define IOV_BATCH 512 /* buffers per pwritev (below IOV_MAX everywhere) */

typedef struct job {
    struct job *next;
    long long token;
    int fd;
    int err;
    /* a write (submit_write): its buffers, written at pos, then synced if sync */
    Py_buffer *bufs;
    Py_ssize_t nbufs;
    long long pos;
    int sync;
} Job;

typedef struct {
    Job *head, *tail;
} JobList;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t lock;
    pthread_cond_t more;
    JobList pending, done;
    pthread_t threads[MAX_THREADS];
    int nthreads;
    int efd;
    int stopping;
    int closed;
} Syncer;

static void
push(JobList *l, Job *j)
{
    j->next = NULL;
    if (l->tail)
        l->tail->next = j;
    else
        l->head = j;
    l->tail = j;
}

static Job *
pop(JobList *l)
{
    Job *j = l->head;
    if (j) {
        l->head = j->next;
        if (!l->head)
            l->tail = NULL;
    }
    return j;
}

/* Write every buffer of ``j`` at ``j->pos``; 0 or the errno of the failed pwritev. */
static int
write_all(Job *j)
{
    struct iovec iov[IOV_BATCH];
    long long pos = j->pos;
    Py_ssize_t i = 0;
    size_t skip = 0; /* bytes of bufs[i] written already */
    for (;;) {
        while (i < j->nbufs && (size_t)j->bufs[i].len == skip) {
            i++;
            skip = 0;
        }
        if (i == j->nbufs)
            return 0;
        int n = 0;
        for (Py_ssize_t k = i; k < j->nbufs && n < IOV_BATCH; k++) {
            size_t off = k == i ? skip : 0;
            if ((size_t)j->bufs[k].len > off) {
                iov[n].iov_base = (char *)j->bufs[k].buf + off;
                iov[n].iov_len = j->bufs[k].len - off;
                n++;
            }
        }
        ssize_t w = pwritev(j->fd, iov, n, pos);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (w == 0)
            return EIO; /* no progress on a regular file: do not spin */
        pos += w;
        size_t left = (size_t)w;
        while (left) {
            size_t avail = j->bufs[i].len - skip;
            if (left < avail) {
                skip += left;
                break;
            }
            left -= avail;
            i++;
            skip = 0;
        }
    }
}

static void
work(Job *j)
{
    if (!j->bufs && !j->nbufs) {
        j->err = fdatasync(j->fd) == 0 ? 0 : errno;
        return;
    }
    int err = write_all(j);
    if (!err && j->sync && fdatasync(j->fd) != 0)
        err = errno;
    if (err) /* nothing of the write stays: it failed, or its sync did (the kernel may drop it) */
        while (ftruncate(j->fd, j->pos) < 0 && errno == EINTR)
            ;
    j->err = err;
}

static void
free_job(Job *j)
{
    /* with the GIL held: releases the buffers of a write */
    for (Py_ssize_t i = 0; i < j->nbufs; i++)
        PyBuffer_Release(&j->bufs[i]);
    free(j->bufs);
    free(j);
}

static void *
run(void *arg)
{
    Syncer *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        while (!s->pending.head && !s->stopping)
            pthread_cond_wait(&s->more, &s->lock);
        Job *j = pop(&s->pending);
        pthread_mutex_unlock(&s->lock);
        if (!j)
            return NULL; /* stopping, and nothing left */
        work(j);
        close(j->fd);
        pthread_mutex_lock(&s->lock);
        push(&s->done, j);
        pthread_mutex_unlock(&s->lock);
        uint64_t one = 1;
        ssize_t n;
        do {
            n = write(s->efd, &one, sizeof one);
        } while (n < 0 && errno == EINTR);
    }
}

static void
stop(Syncer *s)
{
    if (s->closed)
        return;
    s->closed = 1;
    pthread_mutex_lock(&s->lock);
    s->stopping = 1;
    pthread_cond_broadcast(&s->more);
    pthread_mutex_unlock(&s->lock);
    for (int i = 0; i < s->nthreads; i++)
        pthread_join(s->threads[i], NULL);
}

static int
Syncer_init(Syncer *s, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"threads", NULL};
    int threads = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|i:Syncer", kwlist, &threads))
        return -1;
    if (threads < 1 || threads > MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "threads must be 1..%d, not %d", MAX_THREADS, threads);
        return -1;
    }
    if (s->nthreads || s->closed) {
        PyErr_SetString(PyExc_RuntimeError, "Syncer is already initialised");
        return -1;
    }
    s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->efd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->more, NULL);
    for (int i = 0; i < threads; i++) {
        int rc = pthread_create(&s->threads[i], NULL, run, s);
        if (rc != 0) {
            stop(s);
            errno = rc;
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        s->nthreads++;
    }
    return 0;
}

static PyObject *
Syncer_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Syncer *s = (Syncer *)type->tp_alloc(type, 0);
    if (s)
        s->efd = -1;
    return (PyObject *)s;
}

static void
Syncer_dealloc(Syncer *s)
{
    if (s->nthreads) {
        Py_BEGIN_ALLOW_THREADS
        stop(s);
        Py_END_ALLOW_THREADS
        pthread_mutex_destroy(&s->lock);
        pthread_cond_destroy(&s->more);
    }
    Job *j;
    while ((j = pop(&s->done)) != NULL)
        free_job(j);
    if (s->efd >= 0)
        close(s->efd);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static int
check_open(Syncer *s)
{
    if (s->closed || !s->nthreads) {
        PyErr_SetString(PyExc_ValueError, "the Syncer is closed");
        return -1;
    }
    return 0;
}

static PyObject *
Syncer_submit(Syncer *s, PyObject *args)
{
    int fd;
    long long token;
    if (!PyArg_ParseTuple(args, "iL:submit", &fd, &token) || check_open(s) < 0)
        return NULL;
    Job *j = calloc(1, sizeof *j);
    if (!j)
        return PyErr_NoMemory();
    j->token = token;
    j->err = 0;
    j->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (j->fd < 0) {
        free(j);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    pthread_mutex_lock(&s->lock);
    push(&s->pending, j);
    pthread_cond_signal(&s->more);
    pthread_mutex_unlock(&s->lock);
    Py_RETURN_NONE;
}

static PyObject *
Syncer_submit_write(Syncer *s, PyObject *args)
{
    int fd, sync;
    long long token, pos;
    PyObject *buffers;
    if (!PyArg_ParseTuple(args, "iLOLp:submit_write", &fd, &token, &buffers, &pos, &sync) || check_open(s) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(buffers, "buffers must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Job *j = calloc(1, sizeof *j);
    Py_buffer *bufs = calloc(n ? n : 1, sizeof *bufs);
    if (!j || !bufs) {
        free(j);
        free(bufs);
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    j->bufs = bufs;
    for (; j->nbufs < n; j->nbufs++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, j->nbufs), &bufs[j->nbufs], PyBUF_SIMPLE) < 0)
            break;
    Py_DECREF(seq);
    if (j->nbufs < n) {
        free_job(j);
        return NULL;
    }
    j->token = token;
    j->pos = pos;
    j->sync = sync;
    j->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (j->fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        free_job(j);
        return NULL;
    }
    pthread_mutex_lock(&s->lock);
    push(&s->pending, j);
    pthread_cond_signal(&s->more);
    pthread_mutex_unlock(&s->lock);
    Py_RETURN_NONE;
}

static PyObject *
Syncer_fileno(Syncer *s, PyObject *unused)
{
    if (check_open(s) < 0)
        return NULL;
    return PyLong_FromLong(s->efd);
}

static PyObject *
Syncer_done(Syncer *s, PyObject *unused)
{
    if (!s->nthreads)
        return PyList_New(0);
    uint64_t count;
    while (read(s->efd, &count, sizeof count) < 0 && errno == EINTR)
        ; /* EAGAIN: nothing signalled since the last call */
    pthread_mutex_lock(&s->lock);
    Job *j = s->done.head;
    s->done.head = s->done.tail = NULL;
    pthread_mutex_unlock(&s->lock);
    PyObject *out = PyList_New(0);
    while (j) {
        Job *next = j->next;
        if (out) {
            PyObject *pair = Py_BuildValue("(Li)", j->token, j->err);
            if (!pair || PyList_Append(out, pair) < 0)
                Py_CLEAR(out);
            Py_XDECREF(pair);
        }
        free_job(j);
        j = next;
    }
    return out;
}

static PyObject *
Syncer_close(Syncer *s, PyObject *unused)
{
    Py_BEGIN_ALLOW_THREADS
    stop(s);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef Syncer_methods[] = {
    {"submit", (PyCFunction)Syncer_submit, METH_VARARGS, "submit(fd, token): queue an fdatasync of fd"},
    {"submit_write", (PyCFunction)Syncer_submit_write, METH_VARARGS,
     "submit_write(fd, token, buffers, pos, sync): queue a write of buffers at pos, then an fdatasync if sync"},
    {"fileno", (PyCFunction)Syncer_fileno, METH_NOARGS, "the eventfd that is readable once a sync completed"},
    {"done", (PyCFunction)Syncer_done, METH_NOARGS, "the (token, errno) pairs completed since the last call"},
    {"close", (PyCFunction)Syncer_close, METH_NOARGS, "finish the queued syncs and stop the threads"},
    {NULL},
};

static PyTypeObject SyncerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sluice._csyncer.Syncer",
    .tp_basicsize = sizeof(Syncer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "fdatasync in native threads; results through an eventfd (see the module doc)",
    .tp_new = Syncer_new,
    .tp_init = (initproc)Syncer_init,
    .tp_dealloc = (destructor)Syncer_dealloc,
    .tp_methods = Syncer_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "sluice._csyncer",
    "fdatasync in native threads that never hold the GIL", -1, NULL,
};

PyMODINIT_FUNC
PyInit__csyncer(void)
{
    if (PyType_Ready(&SyncerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&SyncerType);
    if (PyModule_AddObject(m, "Syncer", (PyObject *)&SyncerType) < 0) {
        Py_DECREF(&SyncerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
