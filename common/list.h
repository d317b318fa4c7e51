/*
 * list.h - intrusive doubly linked lists: any struct with `prev` and `next`
 * pointers to its own type, and a head pointer. The list owns nothing.
 */
#ifndef GMB_LIST_H
#define GMB_LIST_H

/* Puts @n first in the list at @head. */
#define DLIST_PUSH(head, n)                 \
	do {                                \
		(n)->prev = NULL;           \
		(n)->next = (head);         \
		if (head)                   \
			(head)->prev = (n); \
		(head) = (n);               \
	} while (0)

/* Takes @n out of the list at @head; its links are cleared. */
#define DLIST_UNLINK(head, n)                        \
	do {                                         \
		if ((n)->prev)                       \
			(n)->prev->next = (n)->next; \
		else                                 \
			(head) = (n)->next;          \
		if ((n)->next)                       \
			(n)->next->prev = (n)->prev; \
		(n)->prev = (n)->next = NULL;        \
	} while (0)

#endif
