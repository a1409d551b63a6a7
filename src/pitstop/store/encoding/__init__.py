"""Value encoding: checkpoint records, field maps, chunked values and blob files; bytes in,
bytes out, no SQL. Imports only the contract below it."""
