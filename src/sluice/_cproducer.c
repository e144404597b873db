/* The producer's per-record path, part of the module sluice._crecords: RecordBuffer (the
 * records of a batch: client/accumulator.py's Batch subclasses it, and _RecordBuffer there is
 * its pure-Python reference) and Appender (RecordAppender.append and Producer.send for the
 * common record: client/appender.py and client/producer.py are the reference, and the tests
 * compare the batches both build).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <limits.h>
#include <string.h>
#include <time.h>

#include "_crecords.h"

/* ------------------------------------------------------------------- RecordBuffer */

/* The per-record state of an open batch (client/accumulator.py subclasses it as Batch):
 * the records encoded so far in ``buf`` (a bytearray; the built batch's bytes later, or
 * None), the sink and timestamp of each, and their count, size, reserved memory and
 * timestamp range.  ``add`` and ``resolve_records`` are the per-record work of a batch. */
typedef struct {
    PyObject_HEAD
    PyObject *buf, *futures, *timestamps;
    long long count, size, reserved, base_ts, max_ts;
} RecordBuffer;

static PyTypeObject RecordBufferType;

static PyObject *
RecordBuffer_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    RecordBuffer *self = (RecordBuffer *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->buf = PyByteArray_FromStringAndSize(NULL, 0);
    self->futures = PyList_New(0);
    self->timestamps = PyList_New(0);
    if (self->buf == NULL || self->futures == NULL || self->timestamps == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int
RecordBuffer_traverse(RecordBuffer *self, visitproc visit, void *arg)
{
    Py_VISIT(self->buf);
    Py_VISIT(self->futures);
    Py_VISIT(self->timestamps);
    return 0;
}

static int
RecordBuffer_clear(RecordBuffer *self)
{
    Py_CLEAR(self->buf);
    Py_CLEAR(self->futures);
    Py_CLEAR(self->timestamps);
    return 0;
}

static void
RecordBuffer_dealloc(RecordBuffer *self)
{
    PyObject_GC_UnTrack(self);
    RecordBuffer_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* RecordBuffer.add without argument parsing: 1 added, 0 would not fit, -1 error. */
static int
buffer_add(RecordBuffer *self, Py_ssize_t limit, PyObject *key, PyObject *value, PyObject *headers,
           long long ts, PyObject *sink, long long reserved)
{
    if (self->buf == NULL || !PyByteArray_CheckExact(self->buf) || self->futures == NULL
        || self->timestamps == NULL || !PyList_CheckExact(self->futures) || !PyList_CheckExact(self->timestamps)) {
        PyErr_SetString(PyExc_RuntimeError, "a record added to a batch already built");
        return -1;
    }
    Py_ssize_t size = append_to(self->buf, limit, self->count, ts - self->base_ts, key, value, headers);
    if (size <= 0)
        return (int)size;
    PyObject *t = PyLong_FromLongLong(ts);
    if (t == NULL || PyList_Append(self->timestamps, t) < 0) {
        Py_XDECREF(t);
        goto undo;
    }
    Py_DECREF(t);
    if (PyList_Append(self->futures, sink) < 0) {
        PyList_SetSlice(self->timestamps, self->count, self->count + 1, NULL);
        goto undo;
    }
    self->count++;
    self->size += size;
    self->reserved += reserved;
    if (ts > self->max_ts)
        self->max_ts = ts;
    return 1;
undo: /* out of memory: take the record back out */
    PyByteArray_Resize(self->buf, PyByteArray_GET_SIZE(self->buf) - size);
    return -1;
}

PyDoc_STRVAR(add_doc,
"add(limit, key, value, headers, timestamp, sink, reserved) -> bool\n\n"
"Encode one record into the batch if its records then take at most ``limit`` bytes;\n"
"False (nothing added) when they would not.  ``sink`` (an asyncio or concurrent future,\n"
"or any object with ``done``, ``set_result`` and ``set_exception``) is told its outcome.\n"
"Raises, adding nothing, on a record the format cannot encode.");

static PyObject *
RecordBuffer_add(RecordBuffer *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "add takes 7 arguments");
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[0]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    long long ts = PyLong_AsLongLong(args[4]);
    if (ts == -1 && PyErr_Occurred())
        return NULL;
    long long reserved = PyLong_AsLongLong(args[6]);
    if (reserved == -1 && PyErr_Occurred())
        return NULL;
    int added = buffer_add(self, limit, args[1], args[2], args[3], ts, args[5], reserved);
    if (added < 0)
        return NULL;
    return PyBool_FromLong(added);
}

static PyObject *str_done, *str_set_result, *str_set_results;

PyObject *
new_metadata(PyObject *info, long long offset, PyObject *timestamp)
{
    PyTypeObject *meta = (PyTypeObject *)PyTuple_GET_ITEM(info, 0);
    PyObject *m = meta->tp_alloc(meta, 4);
    PyObject *off = m == NULL ? NULL : PyLong_FromLongLong(offset);
    if (off == NULL) {
        Py_XDECREF(m);
        return NULL;
    }
    PyTuple_SET_ITEM(m, 0, Py_NewRef(PyTuple_GET_ITEM(info, 1)));
    PyTuple_SET_ITEM(m, 1, Py_NewRef(PyTuple_GET_ITEM(info, 2)));
    PyTuple_SET_ITEM(m, 2, off);
    PyTuple_SET_ITEM(m, 3, Py_NewRef(timestamp));
    return m;
}

PyDoc_STRVAR(resolve_records_doc,
"resolve_records(meta_type, topic, partition, base_offset, append_time) -> None\n\n"
"Tell each record's sink not done yet its metadata, ``meta_type((topic, partition, offset,\n"
"timestamp))`` (a tuple subclass of 4 fields): offsets count from ``base_offset`` (all -1\n"
"when it is -1), the timestamp is ``append_time`` unless it is -1, else the record's.  A\n"
"SendFuture is finished in C (its metadata built when asked for); sinks of the first type met\n"
"that has a static ``set_results(sinks, results)`` (RecordFuture's) are told in one call of it, at the end.");

static PyObject *
RecordBuffer_resolve_records(RecordBuffer *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "resolve_records takes 5 arguments");
        return NULL;
    }
    PyTypeObject *meta = (PyTypeObject *)args[0];
    if (!PyType_Check(args[0]) || !PyType_IsSubtype(meta, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "meta_type must be a tuple subclass");
        return NULL;
    }
    long long off = PyLong_AsLongLong(args[3]);
    if (off == -1 && PyErr_Occurred())
        return NULL;
    long long append_time = PyLong_AsLongLong(args[4]);
    if (append_time == -1 && PyErr_Occurred())
        return NULL;
    if (self->futures == NULL || self->timestamps == NULL || !PyList_CheckExact(self->futures)
        || !PyList_CheckExact(self->timestamps)
        || PyList_GET_SIZE(self->futures) != PyList_GET_SIZE(self->timestamps)) {
        PyErr_SetString(PyExc_RuntimeError, "a batch's sinks and timestamps differ in number");
        return NULL;
    }
    long long step = off >= 0 ? 1 : 0;
    PyObject *futures = Py_NewRef(self->futures), *timestamps = Py_NewRef(self->timestamps);
    PyObject *result = NULL;
    /* a SendFuture keeps (meta_type, topic, partition) and builds its metadata when asked */
    PyObject *info = PyTuple_Pack(3, args[0], args[1], args[2]);
    PyObject *appended = append_time != -1 ? PyLong_FromLongLong(append_time) : NULL;
    /* sinks of a type with ``set_results(sinks, results)`` (the first such type met) are told
     * in one call at the end, the others one by one */
    PyTypeObject *seen = NULL, *bulk_type = NULL;
    PyObject *bulk_fn = NULL, *bulk_sinks = NULL, *bulk_results = NULL;
    if (info == NULL || (append_time != -1 && appended == NULL))
        goto out;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(futures); i++, off += step) {
        PyObject *fut = PyList_GET_ITEM(futures, i);
        if (send_future_check(fut)) {
            if (send_future_resolve(fut, info, off, appended ? appended : PyList_GET_ITEM(timestamps, i)) < 0)
                goto out;
            continue;
        }
        if (bulk_type == NULL && Py_TYPE(fut) != seen) {
            seen = Py_TYPE(fut);
            bulk_fn = PyObject_GetAttr((PyObject *)seen, str_set_results);
            if (bulk_fn != NULL) {
                bulk_type = seen;
                bulk_sinks = PyList_New(0);
                bulk_results = PyList_New(0);
                if (bulk_sinks == NULL || bulk_results == NULL)
                    goto out;
            } else if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
                PyErr_Clear();
            } else {
                goto out;
            }
        }
        int bulk = Py_TYPE(fut) == bulk_type;
        if (!bulk) {
            PyObject *done = PyObject_CallMethodNoArgs(fut, str_done);
            if (done == NULL)
                goto out;
            int is_done = PyObject_IsTrue(done);
            Py_DECREF(done);
            if (is_done < 0)
                goto out;
            if (is_done)
                continue;
        }
        PyObject *m = new_metadata(info, off, appended ? appended : PyList_GET_ITEM(timestamps, i));
        if (m == NULL)
            goto out;
        if (bulk) {
            int rc = PyList_Append(bulk_sinks, fut) < 0 ? -1 : PyList_Append(bulk_results, m);
            Py_DECREF(m);
            if (rc < 0)
                goto out;
            continue;
        }
        PyObject *r = PyObject_CallMethodOneArg(fut, str_set_result, m);
        Py_DECREF(m);
        if (r == NULL)
            goto out;
        Py_DECREF(r);
    }
    if (bulk_fn != NULL && PyList_GET_SIZE(bulk_sinks)) {
        PyObject *r = PyObject_CallFunctionObjArgs(bulk_fn, bulk_sinks, bulk_results, NULL);
        if (r == NULL)
            goto out;
        Py_DECREF(r);
    }
    result = Py_NewRef(Py_None);
out:
    Py_XDECREF(bulk_fn);
    Py_XDECREF(bulk_sinks);
    Py_XDECREF(bulk_results);
    Py_XDECREF(info);
    Py_XDECREF(appended);
    Py_DECREF(futures);
    Py_DECREF(timestamps);
    return result;
}

static PyMethodDef RecordBuffer_methods[] = {
    {"add", (PyCFunction)(void (*)(void))RecordBuffer_add, METH_FASTCALL, add_doc},
    {"resolve_records", (PyCFunction)(void (*)(void))RecordBuffer_resolve_records, METH_FASTCALL,
     resolve_records_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef RecordBuffer_members[] = {
    {"buf", T_OBJECT, offsetof(RecordBuffer, buf), 0, "the records encoded so far (bytearray), or the built batch"},
    {"futures", T_OBJECT, offsetof(RecordBuffer, futures), 0, "each record's sink"},
    {"timestamps", T_OBJECT, offsetof(RecordBuffer, timestamps), 0, "each record's timestamp"},
    {"count", T_LONGLONG, offsetof(RecordBuffer, count), 0, "records"},
    {"size", T_LONGLONG, offsetof(RecordBuffer, size), 0, "bytes of the encoded records"},
    {"reserved", T_LONGLONG, offsetof(RecordBuffer, reserved), 0, "buffer memory reserved by them"},
    {"base_ts", T_LONGLONG, offsetof(RecordBuffer, base_ts), 0, "the first record's timestamp"},
    {"max_ts", T_LONGLONG, offsetof(RecordBuffer, max_ts), 0, "the greatest timestamp"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject RecordBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sluice._crecords.RecordBuffer",
    .tp_doc = "The per-record state of a producer's batch (client/accumulator.py).",
    .tp_basicsize = sizeof(RecordBuffer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = RecordBuffer_new,
    .tp_dealloc = (destructor)RecordBuffer_dealloc,
    .tp_traverse = (traverseproc)RecordBuffer_traverse,
    .tp_clear = (inquiry)RecordBuffer_clear,
    .tp_methods = RecordBuffer_methods,
    .tp_members = RecordBuffer_members,
};

/* ------------------------------------------------------------------ MemoryCounter */

/* A producer's buffer memory, counted (client/accumulator.py's MemoryPool subclasses it):
 * bytes ``used`` of ``limit``, and the ``waiters`` (a deque) for more.  The per-record paths
 * read and change the counts without looking attributes up. */
typedef struct {
    PyObject_HEAD
    PyObject *waiters;
    long long used, limit;
} MemoryCounter;

static PyTypeObject MemoryCounterType;

static PyObject *
MemoryCounter_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    MemoryCounter *self = (MemoryCounter *)type->tp_alloc(type, 0);
    if (self != NULL)
        self->waiters = Py_NewRef(Py_None);
    return (PyObject *)self;
}

static int
MemoryCounter_traverse(MemoryCounter *self, visitproc visit, void *arg)
{
    Py_VISIT(self->waiters);
    return 0;
}

static int
MemoryCounter_clear(MemoryCounter *self)
{
    Py_CLEAR(self->waiters);
    return 0;
}

static void
MemoryCounter_dealloc(MemoryCounter *self)
{
    PyObject_GC_UnTrack(self);
    MemoryCounter_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef MemoryCounter_members[] = {
    {"waiters", T_OBJECT, offsetof(MemoryCounter, waiters), 0, "the requests waiting for memory"},
    {"used", T_LONGLONG, offsetof(MemoryCounter, used), 0, "bytes reserved"},
    {"limit", T_LONGLONG, offsetof(MemoryCounter, limit), 0, "bytes in all"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject MemoryCounterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sluice._crecords.MemoryCounter",
    .tp_doc = "The counts of a producer's buffer memory (client/accumulator.py's MemoryPool).",
    .tp_basicsize = sizeof(MemoryCounter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = MemoryCounter_new,
    .tp_dealloc = (destructor)MemoryCounter_dealloc,
    .tp_traverse = (traverseproc)MemoryCounter_traverse,
    .tp_clear = (inquiry)MemoryCounter_clear,
    .tp_members = MemoryCounter_members,
};

int
memory_counts(PyObject *o, long long *used, long long *limit)
{
    if (!PyObject_TypeCheck(o, &MemoryCounterType))
        return -1;
    *used = ((MemoryCounter *)o)->used;
    *limit = ((MemoryCounter *)o)->limit;
    return 0;
}

/* ------------------------------------------------------- the producer's per-record path */

/* RecordAppender.append for the common record, in one call: a record of bytes (a key or
 * none, no headers) for a topic whose route is current, that fits in its partition's open
 * batch, with memory free.  Everything else, and anything unusual, is left to the Python
 * path, which ``append`` tells by returning False after changing nothing.  ``send`` is
 * Producer.send in C around it (the producer makes it its ``send`` with the compiled codec).
 *
 * It is made with the producer's ProducerState (client/state.py, whose docstring draws its
 * shape) and keeps the state's dicts and memory counter, which are never replaced; the
 * producer's Python parts it calls are handed to it as callables. */
typedef struct {
    PyObject_HEAD
    PyObject *state, *topics, *routes, *lanes, *open, *memory, *sticky, *crc32c, *on_full, *py_send,
        *slow_send, *buffered_later;
    PyObject *loop; /* the producer's loop while it takes sends (started, not closing, not fenced), else None */
    int partitioner; /* a custom partitioner: keyed and keyless records choose in Python */
    long long header_size, slack, turn_bytes, turn_records;
} Appender;

static PyTypeObject AppenderType;

static PyObject *str_set_exception, *str_key, *str_headers, *str_partition, *str_timestamp_ms;

static int
Appender_traverse(Appender *self, visitproc visit, void *arg)
{
    Py_VISIT(self->state);
    Py_VISIT(self->topics);
    Py_VISIT(self->routes);
    Py_VISIT(self->lanes);
    Py_VISIT(self->open);
    Py_VISIT(self->memory);
    Py_VISIT(self->sticky);
    Py_VISIT(self->crc32c);
    Py_VISIT(self->on_full);
    Py_VISIT(self->py_send);
    Py_VISIT(self->slow_send);
    Py_VISIT(self->buffered_later);
    Py_VISIT(self->loop);
    return 0;
}

static int
Appender_clear(Appender *self)
{
    Py_CLEAR(self->state);
    Py_CLEAR(self->topics);
    Py_CLEAR(self->routes);
    Py_CLEAR(self->lanes);
    Py_CLEAR(self->open);
    Py_CLEAR(self->memory);
    Py_CLEAR(self->sticky);
    Py_CLEAR(self->crc32c);
    Py_CLEAR(self->on_full);
    Py_CLEAR(self->py_send);
    Py_CLEAR(self->slow_send);
    Py_CLEAR(self->buffered_later);
    Py_CLEAR(self->loop);
    return 0;
}

static void
Appender_dealloc(Appender *self)
{
    PyObject_GC_UnTrack(self);
    Appender_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ``state.<name>``, which must be of ``type``: a new reference, or NULL with an exception set. */
static PyObject *
state_part(PyObject *state, const char *name, PyTypeObject *type)
{
    PyObject *o = PyObject_GetAttrString(state, name);
    if (o != NULL && !PyObject_TypeCheck(o, type)) {
        PyErr_Format(PyExc_TypeError, "ProducerState.%s must be a %s, not %.200s", name, type->tp_name,
                     Py_TYPE(o)->tp_name);
        Py_CLEAR(o);
    }
    return o;
}

static PyObject *
Appender_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *state, *crc32c, *on_full, *py_send, *slow_send, *buffered_later;
    int partitioner;
    long long header_size, slack, turn_bytes, turn_records;
    static char *names[] = {"state", "on_full", "py_send", "slow_send", "buffered_later", "crc32c", "partitioner",
                            "header_size", "slack", "turn_bytes", "turn_records", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOpLLLL:Appender", names, &state, &on_full, &py_send,
                                     &slow_send, &buffered_later, &crc32c, &partitioner, &header_size, &slack,
                                     &turn_bytes, &turn_records))
        return NULL;
    Appender *self = (Appender *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->state = Py_NewRef(state);
    self->crc32c = Py_NewRef(crc32c);
    self->on_full = Py_NewRef(on_full);
    self->py_send = Py_NewRef(py_send);
    self->slow_send = Py_NewRef(slow_send);
    self->buffered_later = Py_NewRef(buffered_later);
    self->loop = Py_NewRef(Py_None);
    if ((self->topics = state_part(state, "topics", &PyDict_Type)) == NULL
        || (self->routes = state_part(state, "routes", &PyDict_Type)) == NULL
        || (self->lanes = state_part(state, "lanes", &PyDict_Type)) == NULL
        || (self->open = state_part(state, "open", &PyDict_Type)) == NULL
        || (self->memory = state_part(state, "memory", &MemoryCounterType)) == NULL
        || (self->sticky = state_part(state, "sticky", &PyDict_Type)) == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->partitioner = partitioner;
    self->header_size = header_size;
    self->slack = slack;
    self->turn_bytes = turn_bytes > 0 ? turn_bytes : LLONG_MAX;
    self->turn_records = turn_records > 0 ? turn_records : LLONG_MAX;
    return (PyObject *)self;
}

/* A Python int as a long long, or -1 (not an int, or out of range: the Python path decides). */
static long long
small_int(PyObject *o)
{
    if (!PyLong_CheckExact(o))
        return -1;
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred())
        PyErr_Clear();
    return v;
}

static long long
now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* ``append`` without argument parsing: 1 buffered, 0 left to the Python path (nothing
 * changed), -1 error (nothing buffered). */
static int
append_impl(Appender *self, PyObject *topic, PyObject *value, PyObject *key, PyObject *headers, PyObject *part,
            PyObject *tsobj, PyObject *sink)
{
    if (headers != Py_None || !PyBytes_CheckExact(value) || (key != Py_None && !PyBytes_CheckExact(key))
        || !PyUnicode_CheckExact(topic))
        return 0;
    int waiting = PyDict_Contains(self->lanes, topic);
    if (waiting != 0)
        return waiting < 0 ? -1 : 0;
    PyObject *route = PyDict_GetItemWithError(self->routes, topic); /* borrowed */
    if (route == NULL)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *info = PyDict_GetItemWithError(self->topics, topic);
    if (info == NULL && PyErr_Occurred())
        return -1;
    if (!PyTuple_CheckExact(route) || PyTuple_GET_SIZE(route) != 4 || PyTuple_GET_ITEM(route, 0) != info)
        return 0;
    long long n = small_int(PyTuple_GET_ITEM(route, 1));
    long long limit = small_int(PyTuple_GET_ITEM(route, 2));
    long long cap = small_int(PyTuple_GET_ITEM(route, 3));
    if (n <= 0 || limit <= 0 || cap <= 0)
        return 0;
    long long p;
    int sticky = 0;
    if (part != Py_None) {
        p = small_int(part);
        if (p < 0 || p >= n)
            return 0;
    } else if (self->partitioner) {
        return 0;
    } else if (key == Py_None) {
        PyObject *s = PyDict_GetItemWithError(self->sticky, topic);
        if (s == NULL)
            return PyErr_Occurred() ? -1 : 0;
        p = small_int(s);
        if (p < 0 || p >= n)
            return 0;
        sticky = 1;
    } else {
        PyObject *c = PyObject_CallOneArg(self->crc32c, key);
        if (c == NULL)
            return -1;
        p = small_int(c);
        Py_DECREF(c);
        if (p < 0)
            return 0;
        p %= n;
    }
    long long reserve = PyBytes_GET_SIZE(value) + (key == Py_None ? 0 : PyBytes_GET_SIZE(key)) + self->slack;
    if (reserve + self->header_size > limit)
        return 0;
    long long ts = tsobj == Py_None ? now_ms() : small_int(tsobj);
    if (ts < 0)
        return 0;
    /* memory: used + reserve within the limit and nobody waiting */
    MemoryCounter *mem = (MemoryCounter *)self->memory;
    int waiters = PyObject_IsTrue(mem->waiters);
    if (waiters != 0)
        return waiters < 0 ? -1 : 0;
    if (mem->used < 0 || mem->used + reserve > mem->limit)
        return 0;
    PyObject *pn = part != Py_None ? Py_NewRef(part) : PyLong_FromLongLong(p);
    PyObject *tp = pn == NULL ? NULL : PyTuple_Pack(2, topic, pn);
    Py_XDECREF(pn);
    if (tp == NULL)
        return -1;
    PyObject *batch = PyDict_GetItemWithError(self->open, tp); /* borrowed */
    Py_DECREF(tp);
    if (batch == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyObject_TypeCheck(batch, &RecordBufferType))
        return 0;
    Py_INCREF(batch);
    long long before = ((RecordBuffer *)batch)->size;
    int added = buffer_add((RecordBuffer *)batch, (Py_ssize_t)cap, key, value, Py_None, ts, sink, reserve);
    if (added <= 0) { /* full: the Python path closes it; or an error (nothing added) */
        Py_DECREF(batch);
        return added;
    }
    mem->used += reserve;
    long long after = ((RecordBuffer *)batch)->size;
    int turn = before / self->turn_bytes != after / self->turn_bytes
        || ((RecordBuffer *)batch)->count % self->turn_records == 0;
    if (after >= cap) {
        PyObject *r = PyObject_CallFunction(self->on_full, "OiLL", batch, sticky, n, p);
        if (r == NULL) {
            Py_DECREF(batch);
            return -1;
        }
        Py_DECREF(r);
        turn = 1;
    }
    Py_DECREF(batch);
    return turn ? 2 : 1;
}

PyDoc_STRVAR(append_doc,
"append(topic, value, key, headers, partition, timestamp_ms, sink) -> int\n\n"
"Buffer the record as RecordAppender.append would, when it is the common case, and return what\n"
"it returns (1; 2 when the loop should turn); 0, having changed nothing, when the Python path\n"
"must take it.");

static PyObject *
Appender_append(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "append takes 7 arguments");
        return NULL;
    }
    int r = append_impl(self, args[0], args[1], args[2], args[3], args[4], args[5], args[6]);
    if (r < 0)
        return NULL;
    return PyLong_FromLong(r);
}

PyObject *
call_as_method(PyObject *fn, PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf) + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *small[8], **all = n + 1 <= 8 ? small : PyMem_Malloc((size_t)(n + 1) * sizeof(PyObject *));
    if (all == NULL)
        return PyErr_NoMemory();
    all[0] = self;
    memcpy(all + 1, args, (size_t)n * sizeof(PyObject *));
    PyObject *r = PyObject_Vectorcall(fn, all, PyVectorcall_NARGS(nargsf) + 1, kwnames);
    if (all != small)
        PyMem_Free(all);
    return r;
}

int
send_arguments(PyObject *const *args, size_t nargsf, PyObject *kwnames, PyObject **fields)
{
    if (PyVectorcall_NARGS(nargsf) != 2)
        return 0;
    fields[0] = fields[1] = fields[2] = fields[3] = Py_None;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        if (name == str_key)
            fields[0] = args[2 + i];
        else if (name == str_headers)
            fields[1] = args[2 + i];
        else if (name == str_partition)
            fields[2] = args[2 + i];
        else if (name == str_timestamp_ms)
            fields[3] = args[2 + i];
        else /* a name not interned, or one send does not take: as Python would */
            return 0;
    }
    return 1;
}

int
appender_check(PyObject *o)
{
    return Py_IS_TYPE(o, &AppenderType);
}

int
appender_open(PyObject *appender)
{
    return ((Appender *)appender)->loop != Py_None;
}

int
appender_submit(PyObject *appender, PyObject *item)
{
    PyObject **f = &PyTuple_GET_ITEM(item, 0);
    int r = append_impl((Appender *)appender, f[0], f[1], f[2], f[3], f[4], f[5], f[6]);
    return r == 2 ? 1 : r;
}

PyDoc_STRVAR(send_doc,
"send(topic, value, *, key=None, headers=None, partition=None, timestamp_ms=None)\n\n"
"Producer.send (see its documentation), with the common record buffered in C.");

static PyObject *
Appender_send(Appender *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *f[4];
    if (!send_arguments(args, nargsf, kwnames, f))
        return PyObject_Vectorcall(self->py_send, args, nargsf, kwnames);
    PyObject *key = f[0], *headers = f[1], *part = f[2], *ts = f[3];
    PyObject *loop = self->loop;
    if (loop == Py_None) /* not started, closing or fenced: Python raises or fails the future */
        return PyObject_Vectorcall(self->py_send, args, nargsf, kwnames);
    PyObject *fut = send_future_new(loop);
    PyObject *buffered = fut == NULL ? NULL : send_future_new(loop);
    if (buffered == NULL) {
        Py_XDECREF(fut);
        return NULL;
    }
    PyObject *topic = args[0], *value = args[1], *r;
    int done = append_impl(self, topic, value, key, headers, part, ts, fut);
    if (done == 1) {
        r = send_future_set_result(buffered, fut) < 0 ? NULL : Py_NewRef(Py_None);
    } else if (done == 2) { /* buffered, and the loop should turn: buffered is told on its next turn */
        PyObject *later[3] = {NULL, buffered, fut}; /* [0]: room for a bound method's self */
        r = PyObject_Vectorcall(self->buffered_later, later + 1, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    } else if (done == 0) {
        PyObject *rest[9] = {NULL, topic, value, key, headers, part, ts, fut, buffered};
        r = PyObject_Vectorcall(self->slow_send, rest + 1, 8 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(fut);
        Py_DECREF(buffered);
        return r; /* the future _send_rest returns: buffered */
    } else if (PyErr_ExceptionMatches(PyExc_Exception)) { /* nothing was buffered: the future says why */
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        PyErr_NormalizeException(&type, &exc, &tb);
        if (tb != NULL)
            PyException_SetTraceback(exc, tb);
        r = PyObject_CallMethodOneArg(buffered, str_set_exception, exc);
        Py_XDECREF(type);
        Py_XDECREF(exc);
        Py_XDECREF(tb);
    } else {
        r = NULL;
    }
    Py_DECREF(fut);
    if (r == NULL) {
        Py_DECREF(buffered);
        return NULL;
    }
    Py_DECREF(r);
    return buffered;
}

static PyMethodDef Appender_methods[] = {
    {"append", (PyCFunction)(void (*)(void))Appender_append, METH_FASTCALL, append_doc},
    {"send", (PyCFunction)(void (*)(void))Appender_send, METH_FASTCALL | METH_KEYWORDS, send_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Appender_members[] = {
    {"loop", T_OBJECT, offsetof(Appender, loop), 0,
     "the producer's loop while it takes sends (started, not closing, not fenced), else None: "
     "the producer sets it"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject AppenderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sluice._crecords.Appender",
    .tp_doc = "Appender(state, on_full, py_send, slow_send, buffered_later, crc32c, partitioner, header_size, "
              "slack, turn_bytes, turn_records): the producer's per-record path for the common record, over its "
              "ProducerState (client/state.py).",
    .tp_basicsize = sizeof(Appender),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Appender_new,
    .tp_dealloc = (destructor)Appender_dealloc,
    .tp_traverse = (traverseproc)Appender_traverse,
    .tp_clear = (inquiry)Appender_clear,
    .tp_methods = Appender_methods,
    .tp_members = Appender_members,
};

int
add_producer_types(PyObject *m)
{
    str_done = PyUnicode_InternFromString("done");
    str_set_result = PyUnicode_InternFromString("set_result");
    str_set_results = PyUnicode_InternFromString("set_results");
    str_set_exception = PyUnicode_InternFromString("set_exception");
    str_key = PyUnicode_InternFromString("key");
    str_headers = PyUnicode_InternFromString("headers");
    str_partition = PyUnicode_InternFromString("partition");
    str_timestamp_ms = PyUnicode_InternFromString("timestamp_ms");
    if (!str_done || !str_set_result || !str_set_results || !str_set_exception || !str_key || !str_headers
        || !str_partition || !str_timestamp_ms)
        return -1;
    if (PyType_Ready(&RecordBufferType) < 0 || PyType_Ready(&MemoryCounterType) < 0
        || PyType_Ready(&AppenderType) < 0)
        return -1;
    return PyModule_AddType(m, &RecordBufferType) < 0 || PyModule_AddType(m, &MemoryCounterType) < 0
                   || PyModule_AddType(m, &AppenderType) < 0
               ? -1
               : 0;
}
