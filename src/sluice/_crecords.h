/* What the parts of sluice._crecords share: _crecords.c (the record codec),
 * _cproducer.c (the producer's per-record path), _cfuture.c (the future of one send) and
 * _coutbox.c (a SyncProducer's records on their way to its loop). */
#ifndef SLUICE_CRECORDS_H
#define SLUICE_CRECORDS_H

#include <Python.h>

/* Append a record (offset and timestamp deltas, key, value: bytes-like or None, headers: a
 * sequence of (str, bytes-like or None) pairs or None) to the bytearray ``buf`` if ``buf``
 * then holds at most ``limit`` bytes: its size, 0 when it would not fit, -1 with an
 * exception set (``buf`` unchanged). */
Py_ssize_t append_to(PyObject *buf, Py_ssize_t limit, long long od, long long td, PyObject *key, PyObject *value,
                     PyObject *headers);

/* Add RecordBuffer and Appender to the module: 0, or -1 with an exception set. */
int add_producer_types(PyObject *module);

/* SendFuture (_cfuture.c), the future of one send.  ``add_future_type`` adds the type to the
 * module (0, or -1 with an exception set); ``send_future_new`` makes a pending one of
 * ``loop``; ``send_future_check`` tells one (exactly that type); ``send_future_resolve``
 * finishes a pending one with a record's RecordMetadata, built from ``info`` (meta_type,
 * topic, partition), ``offset`` and ``timestamp`` only when asked for (1; 0 when it was done
 * already; -1 with an exception set, when a callback could not be scheduled);
 * ``send_future_set_result`` is its set_result (0, or -1 with an exception set). */
int add_future_type(PyObject *module);
/* ``meta_type((topic, partition, offset, timestamp))`` for ``info`` = (meta_type, topic,
 * partition), meta_type a tuple subclass of 4 fields (a new reference, or NULL). */
PyObject *new_metadata(PyObject *info, long long offset, PyObject *timestamp);
PyObject *send_future_new(PyObject *loop);
int send_future_check(PyObject *o);
int send_future_resolve(PyObject *fut, PyObject *info, long long offset, PyObject *timestamp);
int send_future_set_result(PyObject *fut, PyObject *result);

/* For Outbox (_coutbox.c), from _cproducer.c: ``appender_check`` tells an Appender;
 * ``appender_open`` whether its producer takes sends now (started, not closing, not fenced:
 * 1 or 0); ``appender_submit`` buffers ``item``, a tuple (topic,
 * value, key, headers, partition, timestamp_ms, sink), as Producer.submit would buffer the
 * common record (1; 0 when Producer.submit must take it, nothing changed; -1 with an
 * exception set, nothing buffered).  ``add_outbox_type`` adds Outbox to the module. */
int appender_check(PyObject *o);
/* ``fn(self, *args, **kwargs)`` for a vectorcall's arguments (a method's Python path). */
PyObject *call_as_method(PyObject *fn, PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames);
/* The arguments of a ``send(topic, value, *, key, headers, partition, timestamp_ms)`` call
 * as its C path takes them: ``fields`` gets key, headers, partition and timestamp_ms (None
 * when left out) and it returns 1; 0 for any other call (the Python path takes it). */
int send_arguments(PyObject *const *args, size_t nargsf, PyObject *kwnames, PyObject **fields);
int appender_open(PyObject *appender);
int appender_submit(PyObject *appender, PyObject *item);

/* The counts of a producer's MemoryCounter (its MemoryPool): 0, or -1 when ``o`` is not one
 * (no exception set). */
int memory_counts(PyObject *o, long long *used, long long *limit);
int add_outbox_type(PyObject *module);

#endif
