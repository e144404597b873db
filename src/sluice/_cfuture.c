/* SendFuture, part of the module sluice._crecords: the future of one send.
 *
 * It keeps asyncio.Future's contract (done, cancelled, result, exception, add_done_callback,
 * remove_done_callback, cancel, get_loop, set_result, set_exception, await; callbacks run
 * through loop.call_soon in the context they were added in; an exception never retrieved is
 * reported to the loop's exception handler) and asyncio's protocol for future-like objects
 * (``_asyncio_future_blocking``), so tasks, asyncio.gather, wait, wait_for and shield take
 * it as they take an asyncio.Future; it is not an instance of asyncio.Future.
 *
 * What makes it cheaper than asyncio.Future for a producer that makes one per record:
 * creating one asks nothing of the loop; a batch's acknowledgement resolves its records'
 * futures in C without building their RecordMetadata (``result()`` builds it on first ask);
 * awaiting one that is done allocates nothing; and the cyclic garbage collector tracks one
 * only once it holds a callback or an object that could lead back to it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>

#include "_crecords.h"

enum { PENDING, FINISHED, CANCELLED };

typedef struct {
    PyObject_HEAD
    PyObject *loop;
    PyObject *callbacks;  /* pending: a list of (fn, context) tuples, or NULL for none */
    PyObject *result;     /* NULL until set, or built from info on first ask */
    PyObject *exception;  /* NULL, or the exception set */
    PyObject *info;       /* resolved by a batch: (meta_type, topic, partition); else NULL */
    PyObject *timestamp;  /* resolved by a batch: the record's timestamp */
    PyObject *cancel_msg; /* the message cancel() was given, or NULL */
    PyObject *weakreflist;
    long long offset; /* resolved by a batch: the record's offset */
    char state, blocking, log_exception;
} SendFuture;

static PyTypeObject SendFutureType;

static PyObject *str_call_soon, *str_call_exception_handler, *kwnames_context;

/* asyncio.exceptions.<name> (CancelledError, InvalidStateError), imported on first need. */
static PyObject *
asyncio_error(const char *name)
{
    PyObject *mod = PyImport_ImportModule("asyncio.exceptions");
    if (mod == NULL)
        return NULL;
    PyObject *exc = PyObject_GetAttrString(mod, name);
    Py_DECREF(mod);
    return exc;
}

static PyObject *
raise_asyncio(const char *name, PyObject *arg)
{
    PyObject *type = asyncio_error(name);
    if (type == NULL)
        return NULL;
    PyObject *exc = arg == NULL ? PyObject_CallNoArgs(type) : PyObject_CallOneArg(type, arg);
    Py_DECREF(type);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

static PyObject *
invalid_state(const char *message)
{
    PyObject *msg = PyUnicode_FromString(message);
    if (msg == NULL)
        return NULL;
    raise_asyncio("InvalidStateError", msg);
    Py_DECREF(msg);
    return NULL;
}

static void
track(SendFuture *self)
{
    if (!PyObject_GC_IsTracked((PyObject *)self))
        PyObject_GC_Track(self);
}

PyObject *
send_future_new(PyObject *loop)
{
    SendFuture *self = PyObject_GC_New(SendFuture, &SendFutureType);
    if (self == NULL)
        return NULL;
    self->loop = Py_NewRef(loop);
    self->callbacks = self->result = self->exception = self->info = self->timestamp = self->cancel_msg = NULL;
    self->weakreflist = NULL;
    self->offset = -1;
    self->state = PENDING;
    self->blocking = self->log_exception = 0;
    return (PyObject *)self; /* not tracked: nothing it holds can lead back to it yet */
}

int
send_future_check(PyObject *o)
{
    return Py_IS_TYPE(o, &SendFutureType);
}

/* Call loop.call_soon(fn, self, context=ctx): 0, or -1 with an exception set. */
static int
call_soon(SendFuture *self, PyObject *fn, PyObject *ctx)
{
    PyObject *args[4] = {self->loop, fn, (PyObject *)self, ctx};
    PyObject *r = PyObject_VectorcallMethod(str_call_soon, args, 3, kwnames_context);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* The future is done: schedule its callbacks, in the order they were added. */
static int
schedule_callbacks(SendFuture *self)
{
    PyObject *cbs = self->callbacks;
    if (cbs == NULL)
        return 0;
    self->callbacks = NULL;
    int rc = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(cbs) && rc == 0; i++) {
        PyObject *cb = PyList_GET_ITEM(cbs, i);
        rc = call_soon(self, PyTuple_GET_ITEM(cb, 0), PyTuple_GET_ITEM(cb, 1));
    }
    Py_DECREF(cbs);
    return rc;
}

int
send_future_resolve(PyObject *o, PyObject *info, long long offset, PyObject *timestamp)
{
    SendFuture *self = (SendFuture *)o;
    if (self->state != PENDING)
        return 0;
    self->info = Py_NewRef(info);
    self->timestamp = Py_NewRef(timestamp);
    self->offset = offset;
    self->state = FINISHED;
    return schedule_callbacks(self) < 0 ? -1 : 1;
}

int
send_future_set_result(PyObject *o, PyObject *result)
{
    SendFuture *self = (SendFuture *)o;
    if (self->state != PENDING) {
        invalid_state("invalid state");
        return -1;
    }
    self->result = Py_NewRef(result);
    self->state = FINISHED;
    if (PyObject_IS_GC(result))
        track(self);
    return schedule_callbacks(self);
}

/* The result: set, or built from what a batch resolved (a new reference). */
static PyObject *
get_result(SendFuture *self)
{
    if (self->result == NULL) {
        self->result = new_metadata(self->info, self->offset, self->timestamp);
        if (self->result == NULL)
            return NULL;
    }
    return Py_NewRef(self->result);
}

static PyObject *
cancelled_error(SendFuture *self)
{
    return raise_asyncio("CancelledError", self->cancel_msg);
}

static PyObject *
raise_exception(SendFuture *self)
{
    self->log_exception = 0;
    PyErr_SetObject((PyObject *)Py_TYPE(self->exception), self->exception);
    return NULL;
}

/* ------------------------------------------------------------------ type machinery */

static PyObject *
SendFuture_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "SendFuture(loop) takes the loop, positionally");
        return NULL;
    }
    return send_future_new(args[0]);
}

static PyObject *
SendFuture_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *loop;
    if (kw != NULL && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "SendFuture(loop) takes the loop, positionally");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O:SendFuture", &loop))
        return NULL;
    return send_future_new(loop);
}

static int
SendFuture_traverse(SendFuture *self, visitproc visit, void *arg)
{
    Py_VISIT(self->loop);
    Py_VISIT(self->callbacks);
    Py_VISIT(self->result);
    Py_VISIT(self->exception);
    Py_VISIT(self->info);
    Py_VISIT(self->timestamp);
    Py_VISIT(self->cancel_msg);
    return 0;
}

static int
SendFuture_clear(SendFuture *self)
{
    Py_CLEAR(self->loop);
    Py_CLEAR(self->callbacks);
    Py_CLEAR(self->result);
    Py_CLEAR(self->exception);
    Py_CLEAR(self->info);
    Py_CLEAR(self->timestamp);
    Py_CLEAR(self->cancel_msg);
    return 0;
}

/* Report an exception nobody retrieved to the loop's exception handler, as asyncio does. */
static void
SendFuture_finalize(SendFuture *self)
{
    if (!self->log_exception || self->exception == NULL || self->loop == NULL)
        return;
    self->log_exception = 0;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *context = Py_BuildValue("{s:s,s:O,s:O}", "message", "SendFuture exception was never retrieved",
                                      "exception", self->exception, "future", (PyObject *)self);
    if (context != NULL) {
        PyObject *r = PyObject_CallMethodOneArg(self->loop, str_call_exception_handler, context);
        Py_DECREF(context);
        if (r == NULL)
            PyErr_WriteUnraisable((PyObject *)self);
        Py_XDECREF(r);
    } else {
        PyErr_WriteUnraisable((PyObject *)self);
    }
    PyErr_Restore(type, value, tb);
}

static void
SendFuture_dealloc(SendFuture *self)
{
    if (self->log_exception && PyObject_CallFinalizerFromDealloc((PyObject *)self) < 0)
        return; /* resurrected */
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    SendFuture_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Awaiting: the future is its own iterator; it yields itself while pending. */
static PySendResult
SendFuture_am_send(SendFuture *self, PyObject *arg, PyObject **result)
{
    if (self->state == PENDING) {
        self->blocking = 1;
        *result = Py_NewRef(self);
        return PYGEN_NEXT;
    }
    PyObject *r;
    if (self->state == CANCELLED)
        r = cancelled_error(self);
    else if (self->exception != NULL)
        r = raise_exception(self);
    else
        r = get_result(self);
    *result = r;
    return r == NULL ? PYGEN_ERROR : PYGEN_RETURN;
}

static PyObject *
SendFuture_iternext(SendFuture *self)
{
    PyObject *r;
    PySendResult s = SendFuture_am_send(self, Py_None, &r);
    if (s == PYGEN_RETURN) {
        PyObject *stop = PyObject_CallOneArg(PyExc_StopIteration, r); /* the value, even a tuple */
        Py_DECREF(r);
        if (stop != NULL) {
            PyErr_SetObject(PyExc_StopIteration, stop);
            Py_DECREF(stop);
        }
        return NULL;
    }
    return s == PYGEN_NEXT ? r : NULL;
}

static PyObject *
SendFuture_await(SendFuture *self)
{
    return Py_NewRef(self);
}

static PyObject *
SendFuture_repr(SendFuture *self)
{
    if (self->state == PENDING)
        return PyUnicode_FromString("<SendFuture pending>");
    if (self->state == CANCELLED)
        return PyUnicode_FromString("<SendFuture cancelled>");
    if (self->exception != NULL)
        return PyUnicode_FromFormat("<SendFuture finished exception=%R>", self->exception);
    PyObject *r = get_result(self);
    if (r == NULL)
        return NULL;
    PyObject *s = PyUnicode_FromFormat("<SendFuture finished result=%R>", r);
    Py_DECREF(r);
    return s;
}

/* --------------------------------------------------------------------------- methods */

static PyObject *
SendFuture_done(SendFuture *self, PyObject *unused)
{
    return PyBool_FromLong(self->state != PENDING);
}

static PyObject *
SendFuture_cancelled(SendFuture *self, PyObject *unused)
{
    return PyBool_FromLong(self->state == CANCELLED);
}

static PyObject *
SendFuture_result(SendFuture *self, PyObject *unused)
{
    if (self->state == CANCELLED)
        return cancelled_error(self);
    if (self->state == PENDING)
        return invalid_state("Result is not set.");
    if (self->exception != NULL)
        return raise_exception(self);
    return get_result(self);
}

static PyObject *
SendFuture_exception(SendFuture *self, PyObject *unused)
{
    if (self->state == CANCELLED)
        return cancelled_error(self);
    if (self->state == PENDING)
        return invalid_state("Exception is not set.");
    self->log_exception = 0;
    return Py_NewRef(self->exception != NULL ? self->exception : Py_None);
}

static PyObject *
SendFuture_set_result(SendFuture *self, PyObject *result)
{
    if (send_future_set_result((PyObject *)self, result) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
SendFuture_set_exception(SendFuture *self, PyObject *exc)
{
    if (self->state != PENDING)
        return invalid_state("invalid state");
    if (PyExceptionClass_Check(exc)) {
        exc = PyObject_CallNoArgs(exc);
        if (exc == NULL)
            return NULL;
        if (!PyExceptionInstance_Check(exc)) {
            Py_DECREF(exc);
            PyErr_SetString(PyExc_TypeError, "exception class did not make an exception instance");
            return NULL;
        }
    } else {
        Py_INCREF(exc);
    }
    if (!PyExceptionInstance_Check(exc)) {
        Py_DECREF(exc);
        PyErr_SetString(PyExc_TypeError, "invalid exception object");
        return NULL;
    }
    if (PyErr_GivenExceptionMatches(exc, PyExc_StopIteration)) {
        Py_DECREF(exc);
        PyErr_SetString(PyExc_TypeError, "StopIteration interacts badly with generators and cannot be raised into a Future");
        return NULL;
    }
    self->exception = exc;
    self->state = FINISHED;
    self->log_exception = 1;
    track(self);
    if (schedule_callbacks(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
SendFuture_add_done_callback(SendFuture *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *fn = NULL, *ctx = Py_None;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs != 1 || nkw > 1
        || (nkw == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "context") != 0)) {
        PyErr_SetString(PyExc_TypeError, "add_done_callback(fn, *, context=None)");
        return NULL;
    }
    fn = args[0];
    if (nkw == 1)
        ctx = args[1];
    if (ctx == Py_None) {
        ctx = PyContext_CopyCurrent();
        if (ctx == NULL)
            return NULL;
    } else {
        Py_INCREF(ctx);
    }
    int rc;
    if (self->state != PENDING) {
        rc = call_soon(self, fn, ctx);
    } else {
        PyObject *cb = PyTuple_Pack(2, fn, ctx);
        if (cb == NULL) {
            rc = -1;
        } else {
            if (self->callbacks == NULL)
                self->callbacks = PyList_New(0);
            rc = self->callbacks == NULL ? -1 : PyList_Append(self->callbacks, cb);
            Py_DECREF(cb);
            track(self);
        }
    }
    Py_DECREF(ctx);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
SendFuture_remove_done_callback(SendFuture *self, PyObject *fn)
{
    Py_ssize_t removed = 0;
    PyObject *cbs = self->callbacks;
    if (cbs == NULL)
        return PyLong_FromSsize_t(0);
    PyObject *kept = PyList_New(0);
    if (kept == NULL)
        return NULL;
    Py_INCREF(cbs); /* a comparison may run code that changes the list */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(cbs); i++) {
        PyObject *cb = PyList_GET_ITEM(cbs, i);
        Py_INCREF(cb);
        int eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(cb, 0), fn, Py_EQ);
        int rc = eq < 0 ? -1 : eq ? 0 : PyList_Append(kept, cb);
        Py_DECREF(cb);
        if (rc < 0) {
            Py_DECREF(cbs);
            Py_DECREF(kept);
            return NULL;
        }
        removed += eq;
    }
    Py_DECREF(cbs);
    if (self->callbacks != NULL) /* still pending */
        Py_SETREF(self->callbacks, kept);
    else
        Py_DECREF(kept);
    return PyLong_FromSsize_t(removed);
}

static PyObject *
SendFuture_cancel(SendFuture *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *msg = Py_None;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs + nkw > 1 || (nkw == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "msg") != 0)) {
        PyErr_SetString(PyExc_TypeError, "cancel(msg=None)");
        return NULL;
    }
    if (nargs + nkw == 1)
        msg = args[0];
    self->log_exception = 0;
    if (self->state != PENDING)
        Py_RETURN_FALSE;
    self->state = CANCELLED;
    if (msg != Py_None) {
        self->cancel_msg = Py_NewRef(msg);
        track(self);
    }
    if (schedule_callbacks(self) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyObject *
SendFuture_get_loop(SendFuture *self, PyObject *unused)
{
    return Py_NewRef(self->loop);
}

static PyObject *
get_blocking(SendFuture *self, void *closure)
{
    return PyBool_FromLong(self->blocking);
}

static int
set_blocking(SendFuture *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete attribute");
        return -1;
    }
    int b = PyObject_IsTrue(value);
    if (b < 0)
        return -1;
    self->blocking = (char)b;
    return 0;
}

static PyMethodDef SendFuture_methods[] = {
    {"done", (PyCFunction)SendFuture_done, METH_NOARGS, "Whether it is done (finished or cancelled)."},
    {"cancelled", (PyCFunction)SendFuture_cancelled, METH_NOARGS, "Whether it was cancelled."},
    {"result", (PyCFunction)SendFuture_result, METH_NOARGS,
     "The record's RecordMetadata; raises what the send failed with, CancelledError or InvalidStateError."},
    {"exception", (PyCFunction)SendFuture_exception, METH_NOARGS, "What the send failed with, or None."},
    {"set_result", (PyCFunction)SendFuture_set_result, METH_O, "Mark it done with this result."},
    {"set_exception", (PyCFunction)SendFuture_set_exception, METH_O, "Mark it done with this exception."},
    {"add_done_callback", (PyCFunction)(void (*)(void))SendFuture_add_done_callback, METH_FASTCALL | METH_KEYWORDS,
     "add_done_callback(fn, *, context=None): call fn(future) on the loop once it is done."},
    {"remove_done_callback", (PyCFunction)SendFuture_remove_done_callback, METH_O,
     "Remove every callback equal to fn; return how many."},
    {"cancel", (PyCFunction)(void (*)(void))SendFuture_cancel, METH_FASTCALL | METH_KEYWORDS,
     "cancel(msg=None): cancel it unless done; whether it was."},
    {"get_loop", (PyCFunction)SendFuture_get_loop, METH_NOARGS, "The loop it belongs to."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef SendFuture_getset[] = {
    {"_asyncio_future_blocking", (getter)get_blocking, (setter)set_blocking,
     "asyncio's mark of a future-like object, true while a task waits on it", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyAsyncMethods SendFuture_async = {
    .am_await = (unaryfunc)SendFuture_await,
    .am_send = (sendfunc)SendFuture_am_send,
};

static PyTypeObject SendFutureType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sluice._crecords.SendFuture",
    .tp_doc = "SendFuture(loop): the future of one send, with asyncio.Future's contract (see _cfuture.c).",
    .tp_basicsize = sizeof(SendFuture),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = SendFuture_new,
    .tp_vectorcall = SendFuture_vectorcall,
    .tp_dealloc = (destructor)SendFuture_dealloc,
    .tp_finalize = (destructor)SendFuture_finalize,
    .tp_traverse = (traverseproc)SendFuture_traverse,
    .tp_clear = (inquiry)SendFuture_clear,
    .tp_repr = (reprfunc)SendFuture_repr,
    .tp_as_async = &SendFuture_async,
    .tp_iter = (getiterfunc)SendFuture_await,
    .tp_iternext = (iternextfunc)SendFuture_iternext,
    .tp_weaklistoffset = offsetof(SendFuture, weakreflist),
    .tp_methods = SendFuture_methods,
    .tp_getset = SendFuture_getset,
};

int
add_future_type(PyObject *m)
{
    str_call_soon = PyUnicode_InternFromString("call_soon");
    str_call_exception_handler = PyUnicode_InternFromString("call_exception_handler");
    kwnames_context = Py_BuildValue("(s)", "context");
    if (str_call_soon == NULL || str_call_exception_handler == NULL || kwnames_context == NULL
        || PyType_Ready(&SendFutureType) < 0)
        return -1;
    Py_INCREF(&SendFutureType);
    return PyModule_AddObject(m, "SendFuture", (PyObject *)&SendFutureType);
}
