"""Moving runs between stores (export and import) as raw stored records. Stands on the
engine; the backends mix it into their stores."""
