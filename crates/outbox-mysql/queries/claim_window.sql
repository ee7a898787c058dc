SELECT {columns}, {held} AS held
FROM {messages} AS o
WHERE o.seq >= ? AND ({ranges})
