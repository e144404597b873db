/* sluice._csyncer: fdatasync in native threads that never hold the GIL.
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
#include <unistd.h>

#define MAX_THREADS 64

typedef struct job {
    struct job *next;
    long long token;
    int fd;
    int err;
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
        j->err = fdatasync(j->fd) == 0 ? 0 : errno;
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
        free(j);
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
    Job *j = malloc(sizeof *j);
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
        free(j);
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
