#pragma once
// HDF5 datasets: data::Hdf5Dataset (data/hdf5_reader.hpp) reads samples from the datasets of an
// HDF5 file, data::Hdf5Writer (data/hdf5_writer.hpp) writes them. Needs the HDF5 C library
// (Debian libhdf5-dev), linked by the program that includes this, as with LMDB; ember's own
// library does not. All HDF5 calls share one process-wide lock (data/hdf5_common.hpp says why).
#include "ember/data/hdf5_reader.hpp"
#include "ember/data/hdf5_writer.hpp"
