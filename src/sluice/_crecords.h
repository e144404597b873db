/* What the two halves of sluice._crecords share: _crecords.c (the record codec) and
 * _cproducer.c (the producer's per-record path). */
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

#endif
