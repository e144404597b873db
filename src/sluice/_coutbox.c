/* Outbox, part of the module sluice._crecords: a SyncProducer's records sent by its callers
 * and not yet handed to its producer's loop (client/outbox.py's Outbox is the pure-Python
 * reference, and SyncProducer.send the Python path of ``send``).
 *
 * ``send`` is SyncProducer.send for the common record (bytes, no headers, a topic whose
 * route is known and well within its size limit) on the caller's thread: a RecordFuture,
 * the record queued in ``items``, a hand-over scheduled on the loop unless one is pending
 * (``schedule_hand_over(client)``, given to the constructor), or, while buffer memory is
 * short, ``buffer_all(client)`` (given too) until it is buffered.  The facade binds the outbox to its producer once it runs (``bind``) and unbinds it when
 * it closes; unbound, every send takes the Python path.  Bound, the outbox keeps the parts
 * of the producer's ProducerState (client/state.py) it reads.
 * ``hand_over`` runs on the loop and buffers the queued records through the producer's
 * Appender, handing the rest to Producer.submit and reporting a record the Appender
 * refused to Producer.unbuffered(sink, exc).  The RecordFutures it makes get the two
 * attributes RecordFuture.__init__ sets: ``group`` and ``_condition`` (the latter
 * concurrent.futures.Future's own name).
 * Both run under the GIL without calling
 * Python code between reading and changing the shared state (``items``, the byte counts and
 * ``handing``), so a record queued while a hand-over ends is never left behind.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>

#include "_crecords.h"

typedef struct {
    PyObject_HEAD
    PyObject *facade;      /* the SyncProducer */
    PyObject *py_send;     /* SyncProducer.send: every call the common path does not take */
    PyObject *items;       /* deque of (topic, value, key, headers, partition, timestamp_ms, future) */
    PyObject *future_type; /* RecordFuture, made here as its __init__(group) would */
    PyObject *group, *condition;
    PyObject *buffer_all;  /* buffer_all(client): block until every record queued is buffered */
    PyObject *schedule;    /* schedule_hand_over(client): run hand_over(client) on the loop soon */
    /* the producer the facade bound (or None) and its ProducerState's parts (client/state.py) */
    PyObject *client, *topics, *routes, *memory, *appender;
    long long sent_bytes, handed_bytes, margin;
    char handing;
} Outbox;

static PyObject *str_state, *str_topics, *str_routes, *str_memory,
    *str_appender, *str_append, *str_popleft, *str_submit, *str_unbuffered,
    *str_group, *str_condition, *str_group_condition;

static int
Outbox_traverse(Outbox *self, visitproc visit, void *arg)
{
    Py_VISIT(self->facade);
    Py_VISIT(self->py_send);
    Py_VISIT(self->items);
    Py_VISIT(self->future_type);
    Py_VISIT(self->group);
    Py_VISIT(self->condition);
    Py_VISIT(self->buffer_all);
    Py_VISIT(self->schedule);
    Py_VISIT(self->client);
    Py_VISIT(self->topics);
    Py_VISIT(self->routes);
    Py_VISIT(self->memory);
    Py_VISIT(self->appender);
    return 0;
}

static int
Outbox_clear(Outbox *self)
{
    Py_CLEAR(self->facade);
    Py_CLEAR(self->py_send);
    Py_CLEAR(self->items);
    Py_CLEAR(self->future_type);
    Py_CLEAR(self->group);
    Py_CLEAR(self->condition);
    Py_CLEAR(self->buffer_all);
    Py_CLEAR(self->schedule);
    Py_CLEAR(self->client);
    Py_CLEAR(self->topics);
    Py_CLEAR(self->routes);
    Py_CLEAR(self->memory);
    Py_CLEAR(self->appender);
    return 0;
}

static void
Outbox_dealloc(Outbox *self)
{
    PyObject_GC_UnTrack(self);
    Outbox_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Outbox_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *facade, *py_send, *items, *future_type, *group, *buffer_all, *schedule;
    long long margin;
    static char *names[] = {"facade", "py_send", "items", "future_type", "group", "margin", "buffer_all",
                            "schedule_hand_over", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOLOO:Outbox", names, &facade, &py_send, &items, &future_type,
                                     &group, &margin, &buffer_all, &schedule))
        return NULL;
    if (!PyType_Check(future_type)) {
        PyErr_SetString(PyExc_TypeError, "future_type must be a class");
        return NULL;
    }
    if (!PyCallable_Check(buffer_all) || !PyCallable_Check(schedule)) {
        PyErr_SetString(PyExc_TypeError, "buffer_all and schedule_hand_over must be callable");
        return NULL;
    }
    PyObject *condition = PyObject_GetAttr(group, str_group_condition);
    if (condition == NULL)
        return NULL;
    Outbox *self = (Outbox *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(condition);
        return NULL;
    }
    self->facade = Py_NewRef(facade);
    self->py_send = Py_NewRef(py_send);
    self->items = Py_NewRef(items);
    self->future_type = Py_NewRef(future_type);
    self->group = Py_NewRef(group);
    self->condition = condition;
    self->buffer_all = Py_NewRef(buffer_all);
    self->schedule = Py_NewRef(schedule);
    self->margin = margin;
    self->client = Py_NewRef(Py_None);
    self->topics = Py_NewRef(Py_None);
    self->routes = Py_NewRef(Py_None);
    self->memory = Py_NewRef(Py_None);
    self->appender = Py_NewRef(Py_None);
    return (PyObject *)self;
}

/* Remember what belongs to ``client``: 0, or -1 with an exception set. */
static int
bind_client(Outbox *self, PyObject *client)
{
    PyObject *state = PyObject_GetAttr(client, str_state); /* its ProducerState (client/state.py) */
    PyObject *topics = state == NULL ? NULL : PyObject_GetAttr(state, str_topics);
    PyObject *routes = topics == NULL ? NULL : PyObject_GetAttr(state, str_routes);
    PyObject *memory = routes == NULL ? NULL : PyObject_GetAttr(state, str_memory);
    PyObject *appender = memory == NULL ? NULL : PyObject_GetAttr(state, str_appender);
    Py_XDECREF(state);
    if (appender == NULL) {
        Py_XDECREF(topics);
        Py_XDECREF(routes);
        Py_XDECREF(memory);
        return -1;
    }
    long long used, limit;
    if (memory_counts(memory, &used, &limit) < 0 || !appender_check(appender) || !PyDict_CheckExact(topics)
        || !PyDict_CheckExact(routes))
        Py_SETREF(appender, Py_NewRef(Py_None)); /* no compiled path (or not a ProducerState's
                                                    shape): every record the Python way */
    Py_XSETREF(self->client, Py_NewRef(client));
    Py_XSETREF(self->topics, topics);
    Py_XSETREF(self->routes, routes);
    Py_XSETREF(self->memory, memory);
    Py_XSETREF(self->appender, appender);
    return 0;
}

/* A pending RecordFuture of the facade's group, made without running its __init__. */
static PyObject *
new_record_future(Outbox *self)
{
    PyTypeObject *type = (PyTypeObject *)self->future_type;
    PyObject *empty = PyTuple_New(0);
    if (empty == NULL)
        return NULL;
    PyObject *fut = type->tp_new(type, empty, NULL);
    Py_DECREF(empty);
    if (fut == NULL)
        return NULL;
    PyObject *dict = PyObject_GenericGetDict(fut, NULL);
    int rc = dict == NULL ? -1 : PyDict_SetItem(dict, str_group, self->group);
    if (rc == 0)
        rc = PyDict_SetItem(dict, str_condition, self->condition);
    Py_XDECREF(dict);
    if (rc < 0) {
        Py_DECREF(fut);
        return NULL;
    }
    return fut;
}

PyDoc_STRVAR(send_doc,
"send(topic, value, *, key=None, headers=None, partition=None, timestamp_ms=None)\n\n"
"SyncProducer.send (see its documentation), with the common record queued in C.");

static PyObject *send_bound(Outbox *self, PyObject *client, PyObject *const *args, size_t nargsf,
                            PyObject *kwnames);

static PyObject *
Outbox_send(Outbox *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *client = Py_NewRef(self->client); /* bound while the facade's producer runs; the
                                                   facade may unbind while this send runs */
    PyObject *r = send_bound(self, client, args, nargsf, kwnames);
    Py_DECREF(client);
    return r;
}

static PyObject *
send_bound(Outbox *self, PyObject *client, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *f[4];
    if (!send_arguments(args, nargsf, kwnames, f))
        return call_as_method(self->py_send, self->facade, args, nargsf, kwnames);
    PyObject *key = f[0], *headers = f[1], *part = f[2], *ts = f[3];
    PyObject *topic = args[0], *value = args[1];
    if (headers != Py_None || !PyBytes_CheckExact(value) || (key != Py_None && !PyBytes_CheckExact(key))
        || !PyUnicode_CheckExact(topic))
        return call_as_method(self->py_send, self->facade, args, nargsf, kwnames);
    if (client == Py_None || client != self->client || self->appender == Py_None) /* not started, or closed */
        return call_as_method(self->py_send, self->facade, args, nargsf, kwnames);
    /* surely fits: the topic's route is current and the record well within its batch limit */
    PyObject *info = PyDict_GetItemWithError(self->topics, topic);
    PyObject *route = info == NULL ? NULL : PyDict_GetItemWithError(self->routes, topic);
    if (route == NULL) {
        if (PyErr_Occurred())
            return NULL;
        return call_as_method(self->py_send, self->facade, args, nargsf, kwnames);
    }
    long long size = PyBytes_GET_SIZE(value) + (key == Py_None ? 0 : PyBytes_GET_SIZE(key)) + self->margin;
    if (!PyTuple_CheckExact(route) || PyTuple_GET_SIZE(route) != 4 || PyTuple_GET_ITEM(route, 0) != info
        || !PyLong_CheckExact(PyTuple_GET_ITEM(route, 2)) || size > PyLong_AsLongLong(PyTuple_GET_ITEM(route, 2))) {
        if (PyErr_Occurred())
            return NULL;
        return call_as_method(self->py_send, self->facade, args, nargsf, kwnames);
    }
    PyObject *fut = new_record_future(self);
    if (fut == NULL)
        return NULL;
    PyObject *item = PyTuple_Pack(7, topic, value, key, headers, part, ts, fut);
    PyObject *r = item == NULL ? NULL : PyObject_CallMethodOneArg(self->items, str_append, item);
    Py_XDECREF(item);
    if (r == NULL)
        goto fail;
    Py_DECREF(r);
    self->sent_bytes += PyBytes_GET_SIZE(value);
    long long used = 0, limit = 0; /* unbound meanwhile: "short", the blocking way */
    memory_counts(self->memory, &used, &limit); /* a MemoryCounter while bound: bind_client saw to it */
    if (used + self->sent_bytes - self->handed_bytes > limit) {
        /* memory is short: until this record and every one before it is buffered */
        r = PyObject_CallOneArg(self->buffer_all, client);
    } else if (!self->handing) {
        self->handing = 1;
        r = PyObject_CallOneArg(self->schedule, client);
    } else {
        return fut;
    }
    if (r == NULL)
        goto fail;
    Py_DECREF(r);
    return fut;
fail:
    Py_DECREF(fut);
    return NULL;
}

PyDoc_STRVAR(hand_over_doc,
"hand_over(client) -> None\n\n"
"On the producer's loop: buffer (or queue in the producer's waiting line) every record queued,\n"
"in order; ends only after it cleared ``handing`` and then found ``items`` empty.");

PyDoc_STRVAR(bind_doc,
"bind(client) -> None\n\n"
"Send the common record through producer ``client`` (its ``state``, client/state.py) from now on.");

static PyObject *
Outbox_bind(Outbox *self, PyObject *client)
{
    if (bind_client(self, client) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(unbind_doc,
"unbind() -> None\n\n"
"Send every record the Python way from now on (the facade is closing).");

static PyObject *
Outbox_unbind(Outbox *self, PyObject *Py_UNUSED(ignored))
{
    Py_SETREF(self->client, Py_NewRef(Py_None));
    Py_SETREF(self->topics, Py_NewRef(Py_None));
    Py_SETREF(self->routes, Py_NewRef(Py_None));
    Py_SETREF(self->memory, Py_NewRef(Py_None));
    Py_SETREF(self->appender, Py_NewRef(Py_None));
    Py_RETURN_NONE;
}

static PyObject *
Outbox_hand_over(Outbox *self, PyObject *client)
{
    PyObject *appender = NULL;
    int open = 0;
    if (client == self->client && self->appender != Py_None) { /* else every record through submit */
        appender = Py_NewRef(self->appender);
        open = appender_open(appender);
    }
    for (;;) {
        Py_ssize_t n;
        while ((n = PyObject_Length(self->items)) > 0) {
            PyObject *item = PyObject_CallMethodNoArgs(self->items, str_popleft);
            if (item == NULL)
                goto fail;
            if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 7) {
                Py_DECREF(item);
                PyErr_SetString(PyExc_TypeError, "an outbox item is a 7-tuple");
                goto fail;
            }
            PyObject *value = PyTuple_GET_ITEM(item, 1);
            if (value != Py_None) { /* sized when it was sent */
                Py_ssize_t len = PyObject_Length(value);
                if (len < 0)
                    PyErr_Clear();
                else
                    self->handed_bytes += len;
            }
            int done = open > 0 ? appender_submit(appender, item) : 0;
            PyObject *r = NULL;
            if (done == 0) { /* the Python path: Producer.submit */
                PyObject *submit = PyObject_GetAttr(client, str_submit);
                if (submit != NULL) {
                    r = PyObject_Call(submit, item, NULL);
                    Py_DECREF(submit);
                }
            } else if (done < 0 && PyErr_ExceptionMatches(PyExc_Exception)) { /* nothing was buffered */
                PyObject *type, *exc, *tb;
                PyErr_Fetch(&type, &exc, &tb);
                PyErr_NormalizeException(&type, &exc, &tb);
                if (tb != NULL)
                    PyException_SetTraceback(exc, tb);
                PyObject *call[3] = {client, PyTuple_GET_ITEM(item, 6), exc};
                r = PyObject_VectorcallMethod(str_unbuffered, call, 3, NULL);
                Py_XDECREF(type);
                Py_XDECREF(exc);
                Py_XDECREF(tb);
            } else if (done > 0) {
                r = Py_NewRef(Py_None);
            }
            Py_DECREF(item);
            if (r == NULL)
                goto fail;
            Py_DECREF(r);
        }
        if (n < 0)
            goto fail;
        self->handing = 0;
        n = PyObject_Length(self->items);
        if (n <= 0) {
            if (n < 0)
                goto fail;
            break;
        }
        self->handing = 1;
    }
    Py_XDECREF(appender);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(appender);
    return NULL;
}

static PyMethodDef Outbox_methods[] = {
    {"send", (PyCFunction)(void (*)(void))Outbox_send, METH_FASTCALL | METH_KEYWORDS, send_doc},
    {"hand_over", (PyCFunction)Outbox_hand_over, METH_O, hand_over_doc},
    {"bind", (PyCFunction)Outbox_bind, METH_O, bind_doc},
    {"unbind", (PyCFunction)Outbox_unbind, METH_NOARGS, unbind_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Outbox_members[] = {
    {"items", T_OBJECT, offsetof(Outbox, items), READONLY, "the records queued, oldest first"},
    {"sent_bytes", T_LONGLONG, offsetof(Outbox, sent_bytes), 0, "bytes of values queued, ever"},
    {"handed_bytes", T_LONGLONG, offsetof(Outbox, handed_bytes), 0, "bytes of values handed over, ever"},
    {"handing", T_BOOL, offsetof(Outbox, handing), 0, "a hand-over is scheduled or running"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject OutboxType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sluice._crecords.Outbox",
    .tp_doc = "Outbox(facade, py_send, items, future_type, group, margin, buffer_all, schedule_hand_over): "
              "a SyncProducer's records not yet handed to its loop (client/outbox.py).",
    .tp_basicsize = sizeof(Outbox),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Outbox_new,
    .tp_dealloc = (destructor)Outbox_dealloc,
    .tp_traverse = (traverseproc)Outbox_traverse,
    .tp_clear = (inquiry)Outbox_clear,
    .tp_methods = Outbox_methods,
    .tp_members = Outbox_members,
};

static int
intern(PyObject **slot, const char *s)
{
    *slot = PyUnicode_InternFromString(s);
    return *slot == NULL ? -1 : 0;
}

int
add_outbox_type(PyObject *m)
{
    if (intern(&str_state, "state") < 0 || intern(&str_topics, "topics") < 0
        || intern(&str_routes, "routes") < 0 || intern(&str_memory, "memory") < 0
        || intern(&str_appender, "appender") < 0 || intern(&str_append, "append") < 0
        || intern(&str_popleft, "popleft") < 0
        || intern(&str_submit, "submit") < 0 || intern(&str_unbuffered, "unbuffered") < 0
        || intern(&str_group, "group") < 0 || intern(&str_condition, "_condition") < 0
        || intern(&str_group_condition, "condition") < 0
        || PyType_Ready(&OutboxType) < 0)
        return -1;
    Py_INCREF(&OutboxType);
    return PyModule_AddObject(m, "Outbox", (PyObject *)&OutboxType);
}
